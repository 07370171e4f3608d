"""The ``autopilot`` command's first instructions: stop signals are recorded
(autopilot.sigrecord) before anything else is imported, so a ``systemctl stop`` or
``restart`` during the imports of a start-up has its meaning, not a default-action death."""

from __future__ import annotations

from autopilot import sigrecord


def entry() -> None:
    sigrecord.install()
    from autopilot.cli import entry as cli_entry

    cli_entry()
