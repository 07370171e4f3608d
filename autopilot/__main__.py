"""``python -m autopilot``: the same as the ``autopilot`` command."""

from autopilot.boot import entry

entry()
