"""Import a library without the optional extras it probes for at import time.

structlog probes for rich (console, pretty printing, tracebacks: ~50 ms) and httpx
imports its command-line client when click is installed (click, pygments, rich: ~85
ms), at every import, in every process: the supervisor, and each demo harness. Neither
is used here (tracebacks go to a JSON file and journald; we never run httpx's CLI), so
the library is imported with those modules made unimportable for the duration. When one
of them is already loaded (the dashboard loads rich), it is imported normally.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType


def import_hiding(name: str, hidden: tuple[str, ...]) -> ModuleType:
    if name in sys.modules or any(hidden_name in sys.modules for hidden_name in hidden):
        return importlib.import_module(name)
    for hidden_name in hidden:
        sys.modules[hidden_name] = None  # type: ignore[assignment]  # `import h` -> ImportError
    try:
        return importlib.import_module(name)
    finally:
        for hidden_name in hidden:
            del sys.modules[hidden_name]


def httpx() -> ModuleType:
    """httpx without its CLI (``httpx._main``: click, pygments, rich)."""
    return import_hiding("httpx", ("click",))
