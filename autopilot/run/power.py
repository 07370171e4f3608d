"""This host's GPU power draw, sampled while the run lasts, for the report's energy
figures (autopilot.views.energy). One ``nvidia-smi`` query per interval (an argv, a 5 s
bound, killed by its pid past it), appended to ``power.jsonl`` in the state dir.

nvidia-smi's output is untrusted input: rows are shape-checked (an index, a uuid, a
number of watts in a sane range; ``[N/A]`` on a GPU that cannot report is skipped), and
a GPU that reports nothing is left out, never counted as 0 W.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import anyio

from autopilot.config import Preset
from autopilot.logsetup import get_logger
from autopilot.state.statedir import open_append

log = get_logger(__name__)

QUERY = ("--query-gpu=index,uuid,power.draw", "--format=csv,noheader,nounits")
INVENTORY = ("--query-gpu=index,name,uuid,memory.total,power.limit",
             "--format=csv,noheader,nounits")
MAX_WATTS = 5000.0  # above any single GPU's draw: a larger number is not a reading
MAX_GPUS = 64
QUERY_SECS = 5.0
_INDEX = re.compile(r"\d{1,3}")
_UUID = re.compile(r"[A-Za-z0-9-]{1,80}")


def rows(text: str, fields: int) -> list[list[str]]:
    """nvidia-smi's CSV rows with exactly ``fields`` cells (at most MAX_GPUS rows)."""
    out = []
    for line in text.splitlines()[:MAX_GPUS]:
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) == fields and all(len(cell) <= 200 for cell in cells):
            out.append(cells)
    return out


def watts(text: str) -> dict[str, tuple[str, float]]:
    """``{index: (uuid, watts)}`` from a power query; a GPU without a reading is absent."""
    out: dict[str, tuple[str, float]] = {}
    for index, uuid, draw in rows(text, 3):
        try:
            value = float(draw)
        except ValueError:
            continue  # "[N/A]", "[Not Supported]"
        if _INDEX.fullmatch(index) and _UUID.fullmatch(uuid) and 0 <= value < MAX_WATTS:
            out[index] = (uuid, value)
    return out


def inventory(preset: Preset) -> list[dict[str, str]] | None:
    """The GPUs this host shows (recorded per launch in identity.jsonl), or None."""
    binary = shutil.which(preset.cost.nvidia_smi) if preset.samples_power else None
    if not binary:
        return None
    try:
        done = subprocess.run([binary, *INVENTORY], capture_output=True, text=True,
                              timeout=QUERY_SECS, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    keys = ("index", "name", "uuid", "memory_mib", "power_limit_w")
    return [dict(zip(keys, r, strict=True)) for r in rows(done.stdout, 5)] or None


async def query(binary: str) -> str | None:
    """One power query's stdout, or None (no answer within QUERY_SECS, or an error)."""
    try:
        proc = await asyncio.create_subprocess_exec(
            binary, *QUERY, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL)
    except OSError:
        return None
    out = b""
    try:
        with anyio.move_on_after(QUERY_SECS):
            out, _ = await proc.communicate()
    finally:
        if proc.returncode is None:  # past the bound, or the run is ending: our child, by pid
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with anyio.CancelScope(shield=True):
                await proc.wait()
    return out[:65536].decode("utf-8", "replace") if proc.returncode == 0 else None


async def sample_loop(preset: Preset, state_dir: Path) -> None:
    """Sample every ``cost.sample_secs`` until cancelled; nothing at all when the
    endpoint's GPUs are not this host's or nvidia-smi is not there."""
    if not preset.samples_power:
        return
    binary = shutil.which(preset.cost.nvidia_smi)
    if not binary:
        log.info("power_unavailable", why=f"{preset.cost.nvidia_smi} not found")
        return
    path = state_dir / "power.jsonl"
    misses = 0
    while True:
        text = await query(binary)
        got = watts(text) if text else {}
        if got:
            misses = 0
            rec: dict[str, Any] = {"ts": round(time.time(), 3),
                                   "w": {i: w for i, (_, w) in got.items()},
                                   "uuid": {i: u for i, (u, _) in got.items()}}
            with open_append(path, binary=False) as f:
                f.write(json.dumps(rec, separators=(",", ":")) + "\n")
        else:
            misses += 1
            if misses == 3:  # said once, not every interval
                log.warning("power_samples_failing", binary=binary)
        await anyio.sleep(preset.cost.sample_secs)


__all__ = ["inventory", "query", "rows", "sample_loop", "watts"]
