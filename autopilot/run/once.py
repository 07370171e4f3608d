"""``autopilot --once``: one status snapshot rebuilt from the journal, driving nothing
(also what ``regrade`` rewrites status.json with)."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from autopilot.config import Preset
from autopilot.plan import Plan
from autopilot.run import runbook
from autopilot.run.recovery import replay
from autopilot.run.snapshot import RunView, build, prior_elapsed
from autopilot.run.throttle import Throttle
from autopilot.state.fsutil import iso, read_json
from autopilot.state.ledger import Ledger


def snapshot_once(preset: Preset, plan: Plan, state_dir: Path) -> dict[str, Any]:
    """``--once``: a status snapshot rebuilt from the journal, without driving anything."""
    ledger = Ledger(plan)
    replay(state_dir, ledger)
    prior = read_json(state_dir / "status.json")
    started = prior["started_at"] if isinstance(prior, dict) and prior.get("started_at") \
        else iso()
    conc = preset.run.concurrency
    # COMPLETE as the run itself would end: the one completion rule (runbook.outcome)
    ended = runbook.outcome(ledger, runbook.Rules.of(preset), stopped_by=None, paused=None,
                            reason="")
    return build(RunView(
        preset=preset, plan=plan, ledger=ledger,
        phase="COMPLETE" if ended.phase == "COMPLETE" else "stopped", outcome_reason="",
        pass_no=0,
        started_at=started, updated_at=iso(), elapsed=0.0, done_this_session=0,
        throttle=Throttle(conc, conc), pid=os.getpid(), host=socket.gethostname(),
        elapsed_before=prior_elapsed(prior)))
