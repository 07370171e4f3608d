"""The one exception tree of bench-autopilot.

    AutopilotError
     ├── ConfigError            bad preset / overlay / flags        exit 2
     ├── PlanChangedError       state dir holds another plan        exit 2
     ├── PreflightError         something we cannot trust, found before spend  exit 2
     ├── StateDirError          state dir missing, unwritable       exit 2
     ├── LockHeld               another supervisor drives this run  exit 3
     │    ├── OutputsOwned      a finished, unreleased run owns our output dirs
     │    └── SandboxTaken      another run's live sandbox has our cell's name
     └── EndpointError          the model endpoint misbehaves
          ├── EndpointStartTimeout   never became ready
          ├── EndpointCrashed        process / container exited
          └── EndpointFailed         restart budget exhausted

Errors that describe a *cell* (a crash, a stall, a bad grade) are data in the journal,
never exceptions: a cell failing is business as usual for a supervisor.
"""

from __future__ import annotations

EXIT_COMPLETE = 0
EXIT_INCOMPLETE = 1
EXIT_USAGE = 2
EXIT_DOUBLE_DRIVE = 3
EXIT_SIGINT = 130
EXIT_SIGTERM = 143
# SIGUSR2 (``systemctl restart``): handed over, running attempts left to their data paths
EXIT_HANDOVER = 140


class AutopilotError(Exception):
    """Root of every error bench-autopilot raises on purpose."""

    exit_code = EXIT_INCOMPLETE


class ConfigError(AutopilotError, ValueError):
    """A preset, overlay or flag is wrong. The message names file, key path and expectation."""

    exit_code = EXIT_USAGE


class PlanChangedError(ConfigError):
    """The state dir was made by a plan with another identity."""


class StateDirError(AutopilotError, OSError):
    exit_code = EXIT_USAGE


class PreflightError(AutopilotError):
    """A check before launch failed; nothing was started."""

    exit_code = EXIT_USAGE


class LockHeld(AutopilotError):
    """Another live supervisor holds the run (double drive)."""

    exit_code = EXIT_DOUBLE_DRIVE


class OutputsOwned(LockHeld):
    """A finished run that was not released owns output dirs this run would write."""


class SandboxTaken(LockHeld):
    """Another run's live sandbox container has the name one of this run's cells uses
    (on one Docker daemon): its harness would remove it at start."""


class EndpointError(AutopilotError):
    pass


class EndpointStartTimeout(EndpointError, TimeoutError):
    pass


class EndpointCrashed(EndpointError):
    pass


class EndpointFailed(EndpointError):
    """Restarted too often inside the restart window: the run ends INCOMPLETE."""
