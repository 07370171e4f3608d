"""Golden traces of whole runs: what the loop decided, in order, with nothing that
depends on timing or on the machine.

A trace line is ``event cell verdict/reason`` for the decisions a run journals (verdicts,
quarantines, adoptions, abandonment, milestones by kind, passes, the run's end). It is
taken at concurrency 1, where the order of decisions is a function of the preset and its
seed alone, so that moving code between modules can be proven to change no behaviour:
``python tests/goldenrun.py OUT_DIR`` writes every trace and every shipped preset's
``--dry-run`` text; tests/test_golden.py compares them with tests/golden/.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# (name, preset, target N): seeded presets whose decisions are deterministic at
# concurrency 1 (demo-chaos: its endpoint crash, hangs and grader streak are by count).
RUNS = [("demo", "demo", 2), ("demo-chaos", "demo-chaos", 2)]
DECISIONS = {"cell_verdict", "cell_quarantined", "cell_adopted", "cell_abandoned",
             "pass_started", "run_finished", "launching_paused", "cell_killed"}


def _env() -> dict[str, str]:
    # A fixed, minimal environment: what --dry-run says is withheld from children must
    # not depend on the machine the trace is taken on.
    keep = ("PATH", "HOME", "LANG", "PYTHONDONTWRITEBYTECODE")
    return {**{k: os.environ[k] for k in keep if k in os.environ}, "PYTHONUNBUFFERED": "1"}


def trace(events: list[dict[str, Any]]) -> list[str]:
    out = []
    for ev in events:
        name = ev.get("event")
        if name == "milestone":
            out.append(f"milestone {ev.get('kind')} {ev.get('arm') or ''}".rstrip())
        elif name == "cell_verdict":
            why = ev.get("reason") or ev.get("word") or ""
            out.append(f"cell_verdict {ev['cell']}#{ev['attempt']} {ev['verdict']} {why}"
                       .rstrip())
        elif name == "cell_killed":
            out.append(f"cell_killed {ev['cell']}#{ev['attempt']} {ev.get('kind')}")
        elif name == "pass_started":
            out.append(f"pass_started {ev['pass']} pending={ev['pending']}")
        elif name == "run_finished":
            out.append(f"run_finished {ev.get('outcome')} {ev.get('reason') or ''}".rstrip())
        elif name in DECISIONS:
            out.append(f"{name} {ev.get('cell') or ''}".rstrip())
    return out


def run_trace(preset: str, n: int, state_dir: Path) -> list[str]:
    r = subprocess.run(
        [sys.executable, "-m", "autopilot.cli", "--preset", preset, "--target-n", str(n),
         "--concurrency", "1", "--state-dir", str(state_dir), "--quiet"],
        capture_output=True, text=True, timeout=600, env=_env(), cwd=ROOT)
    lines = (state_dir / "journal.jsonl").read_text().splitlines()
    events = [json.loads(line) for line in lines if line.strip()]
    return [f"rc {r.returncode}", *trace(events)]


def presets() -> list[str]:
    return sorted(p.stem for p in (ROOT / "presets").glob("*.toml")
                  if not p.stem.startswith("_"))


def dry_run(preset: str, state_dir: Path, bench: Path | None = None) -> str:
    env, extra = _env(), []
    if bench is not None:  # the MMBT presets against an origin-shaped checkout
        fake = ROOT / "tests" / "fakebin"
        env.update(BENCH_DIR=str(bench), LLAMA_SERVER=str(fake / "llama-server"),
                   VLLM=str(fake / "vllm"), QWEN27B_GGUF=str(fake / "llama-server"),
                   MODEL_397B_GGUF=str(fake / "llama-server"), STEP3P7_MODEL=str(fake))
        overlay = state_dir.parent / "no-sandbox.json"  # no Docker engine needed
        overlay.write_text(json.dumps({"harness": {"sandbox_container": "",
                                                   "scratch_remove_image": ""}}))
        extra = ["--config", str(overlay)]
    r = subprocess.run(
        [sys.executable, "-m", "autopilot.cli", "--preset", preset, "--target-n", "2",
         "--dry-run", "--state-dir", str(state_dir), *extra],
        capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    text = f"rc {r.returncode}\n{r.stdout}{r.stderr}"
    # Machine-specific values: the checkout, the state dir and this interpreter.
    for path, name in ((bench, "BENCH"), (state_dir, "STATE"), (state_dir.parent, "TMP"),
                       (ROOT, "ROOT")):
        if path is not None:
            text = text.replace(str(path), name)
    if bench is not None:  # its identity hashes the checkout's paths: a temp dir
        text = re.sub(r"identity [0-9a-f]{16}", "identity ID", text)
    # Which containment a run would use depends on the machine (root, cgroup v2).
    text = re.sub(r"(?m)^containment: .*$", "containment: MODE", text)
    # Who harnesses run as names the user running it (root, or not).
    text = re.sub(r"(?m)^harness user: .*$", "harness user: WHO", text)
    return text.replace(sys.executable, "PYTHON")


def write_all(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name, preset, n in RUNS:
            lines = run_trace(preset, n, Path(tmp) / name)
            (out / f"run-{name}.txt").write_text("\n".join(lines) + "\n")
        sys.path.insert(0, str(ROOT / "tests"))
        from mmbt_fixture import add_p1_helper, make_checkout

        bench = make_checkout(Path(tmp))
        add_p1_helper(bench)
        for p in presets():
            (out / f"dryrun-{p}.txt").write_text(dry_run(p, Path(tmp) / f"dry-{p}"))
            (out / f"dryrun-{p}-checkout.txt").write_text(
                dry_run(p, Path(tmp) / f"dryc-{p}", bench))


if __name__ == "__main__":
    write_all(Path(sys.argv[1]))
