"""The chaos drill of tools/bench.py, shortened: the supervisor SIGKILLed at 5 random
moments of one demo-chaos run (endpoint crash, hanging cells, grader failures on),
restarted each time. The run must end COMPLETE with every cell counted exactly once,
no completed cell re-run, no orphan process, and a journal that replays on its own to a
complete run. A second drill runs every cell in a Docker sandbox: no container is left."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from conftest import ROOT

pytestmark = pytest.mark.slow


def load_bench():
    spec = importlib.util.spec_from_file_location("bench", ROOT / "tools" / "bench.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench"] = mod  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("seed", [3])
def test_five_sigkills_then_complete(tmp_path: Path, seed: int) -> None:
    r = load_bench().chaos(tmp_path, kills=5, seed=seed)
    assert r["rc"] == 0 and r["phase"] == "COMPLETE"
    assert r["cells"] == 24 and r["double"] == [] and r["rerun"] == []
    assert r["orphans"] == []
    assert r["replayed_complete"]
    assert r["killed"] >= 2  # it really was interrupted and resumed


def test_five_sigkills_with_docker_sandboxes_leave_no_container(
        docker_host: str, test_images: dict[str, str], tmp_path: Path) -> None:
    r = load_bench().chaos(tmp_path, kills=5, seed=5,
                           docker=(docker_host, test_images["busybox"]))
    assert r["rc"] == 0 and r["phase"] == "COMPLETE"
    assert r["cells"] == 24 and r["double"] == [] and r["rerun"] == []
    assert r["orphans"] == [] and r["containers"] == []
    assert r["replayed_complete"]
    assert r["killed"] >= 2  # it really was interrupted and resumed
