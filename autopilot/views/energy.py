"""Energy per cell and per arm, from the power samples (power.jsonl, autopilot.run.power)
and the journal's attempt spans: what the report shows beside token cost.

The rule (``apportion``, pure): between two samples a GPU draws what the earlier one
read; at every instant a replica's draw (the sum over its GPUs) is split equally among
the attempts running on that replica then; time no attempt runs is the endpoint's idle
draw, reported, never charged to a cell. A gap in the samples longer than ``max_gap`` is
not filled in: the cells then running are marked partly sampled. INVALID attempts burn
energy too and are counted to their cell, as the budget counts their tokens.
"""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from autopilot.config import Preset
from autopilot.state.cellevents import CellExited, CellStarted
from autopilot.state.eventbase import CellEventBase
from autopilot.state.fsutil import parse_iso
from autopilot.state.journal import state_events
from autopilot.state.untrusted import lines, owner_of

Sample = tuple[float, Mapping[str, float]]  # (epoch seconds, {gpu index: watts})
J_PER_KWH = 3.6e6


@dataclass(frozen=True)
class Span:
    cell: str
    replica: int
    start: float
    end: float


@dataclass
class Energy:
    joules: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    sampled: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # secs
    ran: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # secs
    idle_joules: float = 0.0

    def coverage(self, cell: str) -> float:
        return self.sampled[cell] / self.ran[cell] if self.ran.get(cell) else 0.0


def apportion(samples: Sequence[Sample], spans: Sequence[Span],
              gpus_of: Mapping[int, frozenset[str] | None], max_gap: float) -> Energy:
    """Each cell's joules (see the module's rule). ``gpus_of[replica]``: its GPU
    indices, None for every GPU the samples show."""
    out = Energy()
    samples = sorted(samples, key=lambda s: s[0])
    by_replica: dict[int, list[Span]] = defaultdict(list)
    for span in spans:
        if span.end > span.start:
            by_replica[span.replica].append(span)
    for replica in sorted(set(by_replica) | set(gpus_of)):
        gpus = gpus_of.get(replica)
        draw = [(ts, sum(watts for gpu, watts in by_gpu.items() if gpus is None or gpu in gpus))
                for ts, by_gpu in samples]
        mine = by_replica.get(replica, [])
        bounds = sorted({ts for ts, _ in draw} | {span.start for span in mine}
                        | {span.end for span in mine} | {ts + max_gap for ts, _ in draw})
        starts = sorted(range(len(mine)), key=lambda i: mine[i].start)
        ends = sorted(range(len(mine)), key=lambda i: mine[i].end)
        active: set[int] = set()
        next_start = next_end = next_draw = 0
        current: tuple[float, float] | None = None
        for begin, end in itertools.pairwise(bounds):
            while next_start < len(starts) and mine[starts[next_start]].start <= begin:
                active.add(starts[next_start])
                next_start += 1
            while next_end < len(ends) and mine[ends[next_end]].end <= begin:
                active.discard(ends[next_end])
                next_end += 1
            while next_draw < len(draw) and draw[next_draw][0] <= begin:
                current = draw[next_draw]
                next_draw += 1
            length = end - begin
            known = current is not None and begin - current[0] < max_gap
            if not active:
                if known and current is not None and replica in gpus_of:
                    out.idle_joules += current[1] * length
                continue
            for i in active:
                cell = mine[i].cell
                out.ran[cell] += length
                if known and current is not None:
                    out.joules[cell] += current[1] * length / len(active)
                    out.sampled[cell] += length
    return out


def energy_of(samples: Sequence[Sample], index_of: Mapping[str, str], spans: list[Span],
              gpus_of: dict[int, frozenset[str] | None], max_gap: float) -> Energy:
    """``apportion`` with GPUs named by uuid mapped to indices, and replicas that share
    every GPU (no CUDA_VISIBLE_DEVICES each) pooled: their draw is one draw."""
    if len(gpus_of) > 1 and None in gpus_of.values():
        spans = [Span(span.cell, 0, span.start, span.end) for span in spans]
        gpus_of = {0: None}
    gpus_of = {replica: None if gpus is None else frozenset(index_of.get(gpu, gpu) for gpu in gpus)
               for replica, gpus in gpus_of.items()}
    return apportion(samples, spans, gpus_of, max_gap)


def replica_gpus(preset: Preset) -> dict[int, frozenset[str] | None]:
    """Each replica's GPUs: its ``replica_env`` CUDA_VISIBLE_DEVICES, else the docker
    ``gpus`` setting, else every GPU (None)."""
    return {i: preset.endpoint.gpus(i) for i in range(preset.endpoint.replicas)}


def read_samples(state_dir: Path) -> tuple[list[Sample], dict[str, str]]:
    """power.jsonl, shape-checked (a state file: untrusted), and each GPU uuid's index
    (CUDA_VISIBLE_DEVICES may name either)."""
    out: list[Sample] = []
    index_of: dict[str, str] = {}
    for raw in lines(state_dir / "power.jsonl", owner_of(state_dir)):
        try:
            rec = json.loads(raw)
        except ValueError:
            continue
        ts, by_gpu = (rec.get("ts"), rec.get("w")) if isinstance(rec, dict) else (None, None)
        if not isinstance(ts, int | float) or not isinstance(by_gpu, dict):
            continue
        uuids = rec.get("uuid") if isinstance(rec.get("uuid"), dict) else {}
        got: dict[str, float] = {}
        for k, watts in list(by_gpu.items())[:64]:
            if isinstance(k, str) and isinstance(watts, int | float) and 0 <= watts < 5000:
                got[k[:8]] = float(watts)
                if isinstance(uuids.get(k), str):
                    index_of[uuids[k][:80]] = k[:8]
        out.append((float(ts), got))
    return out, index_of


def read_spans(state_dir: Path) -> list[Span]:
    """Every attempt's span on its replica: cell_started to cell_exited (or to the
    attempt's last event, for one a kill cut short)."""
    open_: dict[tuple[str, int], tuple[float, int]] = {}
    last: dict[tuple[str, int], float] = {}
    spans = []
    for event in state_events(state_dir).typed():
        ts = parse_iso(event.ts)
        if not isinstance(event, CellEventBase) or not event.cell or event.attempt is None \
                or ts is None:
            continue
        key = (event.cell, event.attempt)
        if isinstance(event, CellStarted) and event.pid is not None:
            open_[key] = (ts, event.replica or 0)
        elif key in open_:
            last[key] = ts
            if isinstance(event, CellExited):
                start, replica = open_.pop(key)
                spans.append(Span(event.cell, replica, start, ts))
    spans += [Span(cell, on_replica, begun, last.get((cell, attempt), begun))
              for (cell, attempt), (begun, on_replica) in open_.items()]
    return spans


def _figure(value: float) -> str:
    """Three significant figures, never in exponent form (a short test run is 0.000375
    kWh; a night is 12.4)."""
    return f"{value:.2f}" if value >= 100 else f"{float(f'{value:.3g}'):f}".rstrip("0").rstrip(".")


def measure(preset: Preset, state_dir: Path) -> Energy | None:
    """The run's energy per cell, or None where no power was sampled."""
    samples, index_of = read_samples(state_dir)
    if not samples:
        return None
    # two missed samples in a row are a gap, not a reading held
    return energy_of(samples, index_of, read_spans(state_dir), replica_gpus(preset),
                     2.5 * preset.cost.sample_secs)


def energy_lines(preset: Preset, energy: Energy | None, cells: Mapping[str, str]) -> list[str]:
    """The report's energy table (``cells``: cell id -> arm), or why there is none."""
    if energy is None:
        why = ("cost.power = off" if preset.cost.power == "off" else
               f"{preset.cost.nvidia_smi} was not found or did not answer"
               if preset.samples_power
               else f"the endpoint ({preset.endpoint.engine}, {preset.backend.kind} "
               "backend) does not run on this host's GPUs")
        return [f"Energy: unavailable (no power samples: {why})."]
    price = preset.cost.usd_per_kwh
    out = [f"Energy: GPU power draw sampled every {preset.cost.sample_secs:g} s, split "
           "equally among the attempts running on a replica at each instant (INVALID "
           "attempts included); " + (f"priced at ${price:g}/kWh." if price else
                                     "unpriced (set cost.usd_per_kwh)."),
           "", "| arm | cells | energy (kWh) | energy cost (USD) | sampled |",
           "|---|---|---|---|---|"]
    for arm in dict.fromkeys(cells.values()):
        mine = [cell for cell, cell_arm in cells.items()
                if cell_arm == arm and energy.ran.get(cell)]
        kwh = sum(energy.joules[cell] for cell in mine) / J_PER_KWH
        ran = sum(energy.ran[cell] for cell in mine)
        cover = sum(energy.sampled[cell] for cell in mine) / ran if ran else 0.0
        cost = _figure(kwh * price) if price else "unpriced"
        out.append(f"| {arm} | {len(mine)} | {_figure(kwh)} | {cost} | {cover:.0%} |")
    out += ["", "Idle draw (no attempt running; not charged to a cell): "
            f"{_figure(energy.idle_joules / J_PER_KWH)} kWh."]
    return out


__all__ = ["Energy", "Span", "apportion", "energy_lines", "energy_of", "measure",
           "read_samples", "read_spans", "replica_gpus"]
