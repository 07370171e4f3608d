"""``python -m autopilot``: the same as the ``autopilot`` command."""

from autopilot.cli import entry

entry()
