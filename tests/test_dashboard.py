"""The read-only dashboard: snapshots of every view over fixture state dirs, a real
browser on the HTML page, --watch in a pseudo-terminal, and a live demo run."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import (
    ROOT,
    chromium,
    cli_env,
    events,
    reap_or_kill,
    spawn_cli,
    wait_for,
    write_overlay,
)
from dashfix import XSS_TASK, complete, partial, trust, wide

GOLDEN = ROOT / "tests" / "golden"
VIEWS = {
    "grid": ["--no-color", "--width", "120"],
    "grid-bare": ["--no-color", "--width", "120", "--no-events", "--no-sparkline"],
    "oneline": ["--oneline"],
    "json": ["--json"],
    "trend": ["--trend", "--no-color", "--width", "120"],
    "flips": ["--flips", "--no-color", "--width", "120"],
}


def dash(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "autopilot.views.dashboard.cli", *args],
                          capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env=env or cli_env())


def normalise(view: str, text: str) -> str:
    if view == "json":
        doc = json.loads(text)
        doc["generated_at"] = "<generated>"
        if doc.get("liveness"):
            doc["liveness"]["heartbeat_age_secs"] = "<age>"
        return json.dumps(doc, indent=1, sort_keys=True) + "\n"
    return text


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / f"{name}.txt"
    if os.environ.get("UPDATE_GOLDEN") or not path.exists():
        path.write_text(text)
        if not os.environ.get("UPDATE_GOLDEN"):
            pytest.fail(f"golden file {path.name} was missing; written, review and commit it")
    assert text == path.read_text(), f"{name} differs from its golden file"


def tree(state: Path) -> dict[str, int]:
    return {str(p.relative_to(state)): p.stat().st_mtime_ns for p in state.rglob("*")}


@pytest.mark.parametrize("fixture", [partial, complete, trust])
@pytest.mark.parametrize("view", list(VIEWS))
def test_snapshots(tmp_path: Path, fixture, view: str) -> None:
    state = fixture(tmp_path)
    before = tree(state)
    r = dash("--state-dir", str(state), *VIEWS[view])
    assert r.returncode == 0, r.stderr
    check_golden(f"dash-{state.name}-{view}", normalise(view, r.stdout))
    assert tree(state) == before  # read-only


def test_wide_grid_goes_compact_instead_of_cutting_cells(tmp_path: Path) -> None:
    # N=20 on an 80-column terminal: one column per replicate would be cut to '…' by
    # rich; the grid switches to one strip of one-letter codes that wraps.
    state = wide(tmp_path)
    text = dash("--state-dir", str(state), "--no-color", "--width", "80", "--no-events").stdout
    check_golden("dash-wide-grid-80", text)
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= 80
    rows = {line.split()[0]: line.split()[1:] for line in text.splitlines()
            if line.startswith(("t_", "task"))}
    assert rows["task"][0] == "v1-v20"
    # codes: p masked pass, s/m invalid reason, Q quarantined, ! frozen running, . pending
    assert rows["t_alpha"] == ["PPPPF", "PPFPP", "PPPPP", "PPFPP", "17/20"]
    assert rows["t_beta"] == ["FFPFF", "FsFFF", "FFmFF", "FpFF!", "2/17"]
    assert rows["t_gamma"] == ["PPPFF", "PPPPQ", "PPPPP", "PP...", "14/16"]
    # wide enough: one column per replicate, full codes (Is, P*)
    text = dash("--state-dir", str(state), "--no-color", "--width", "200", "--no-events").stdout
    assert "v20" in text and "v1-v20" not in text and "Is" in text and "P*" in text


def test_compact_switch_is_exact_at_the_boundary(tmp_path: Path) -> None:
    import io

    from autopilot.views.dashboard import model, term

    data = model.load(wide(tmp_path))
    assert data is not None
    table, compact = term.grid_table(data, "m-nothink")
    assert not compact
    out = io.StringIO()
    term.make_console(True, 1000, out).print(table)
    natural = max(len(line) for line in out.getvalue().splitlines())
    table, compact = term.grid_table(data, "m-nothink", natural)
    assert not compact  # exactly fits: one column per replicate
    out = io.StringIO()
    term.make_console(True, natural, out).print(table)
    assert "…" not in out.getvalue()
    assert term.grid_table(data, "m-nothink", natural - 1)[1]  # one column less: compact


def test_empty_state_dir_every_view(tmp_path: Path) -> None:
    for args in VIEWS.values():
        r = dash("--state-dir", str(tmp_path / "nothing"), *args)
        assert r.returncode == 0 and "no run yet" in r.stdout
    r = dash("--state-dir", str(tmp_path / "nothing"), "--html", str(tmp_path / "x.html"))
    assert r.returncode == 0 and "no run yet" in r.stdout
    assert not (tmp_path / "nothing").exists()


def test_grid_content_and_trust_visible(tmp_path: Path) -> None:
    text = dash("--state-dir", str(trust(tmp_path)), "--no-color", "--width", "160").stdout
    assert "P*" in text  # teardown-masked, readable without colour
    assert "Q" in text and "invalid attempts 5" in text and "quarantined 1" in text
    assert "teardown-masked 1" in text
    text = dash("--state-dir", str(partial(tmp_path)), "--no-color", "--width", "120").stdout
    assert "R2m" in text  # frozen past the warn threshold
    assert " R " in text or "R  " in text


def test_no_color_env_strips_ansi(tmp_path: Path) -> None:
    state = complete(tmp_path)
    env = cli_env(NO_COLOR="1", TERM="xterm-256color")
    r = dash("--state-dir", str(state), env=env)
    assert "\x1b[" not in r.stdout


def test_trend_flags_misleading_small_n(tmp_path: Path) -> None:
    text = dash("--state-dir", str(complete(tmp_path)), "--trend", "--no-color",
                "--width", "160").stdout
    gamma = next(line for line in text.splitlines() if line.strip().startswith("t_gamma"))
    assert "3/3 100%" in gamma and "3/5  60%" in gamma and "misleading at small N" in gamma
    beta = next(line for line in text.splitlines() if line.strip().startswith("t_beta"))
    assert "misleading" not in beta
    flips = dash("--state-dir", str(complete(tmp_path / "c2")), "--flips", "--no-color",
                 "--width", "160").stdout
    beta = next(line for line in flips.splitlines() if line.strip().startswith("t_beta"))
    assert "FAIL" in beta and "v3:P" in beta


def test_html_refuses_state_dir(tmp_path: Path) -> None:
    state = complete(tmp_path)
    r = dash("--state-dir", str(state), "--html", str(state / "dashboard.html"))
    assert r.returncode == 2 and "never writes" in r.stderr
    assert not (state / "dashboard.html").exists()


def test_html_in_headless_chromium(tmp_path: Path) -> None:
    state = trust(tmp_path)
    page = tmp_path / "out" / "dash.html"
    page.parent.mkdir()  # the dashboard writes into an existing directory only
    assert dash("--state-dir", str(state), "--html", str(page)).returncode == 0
    html = page.read_text()
    assert "<script" not in html.replace("&lt;script", "")  # only escaped forms
    assert 'http-equiv="refresh"' in html and "<svg" in html
    assert not re.search(r"""(src|href)=["']https?://""", html)  # self-contained
    dom = chromium(tmp_path, page.as_uri(), "--dump-dom").stdout
    assert '<table class="grid" data-arm="m-nothink">' in dom
    assert dom.count('<table class="grid"') == 2
    assert "&lt;script&gt;document.body.setAttribute" in dom  # rendered as text
    assert "data-pwned=\"1\"" not in dom  # and it never ran
    assert "&lt;b&gt;zero_tokens&lt;/b&gt;" in dom or "INVALID(&lt;b&gt;" in dom
    assert XSS_TASK not in dom


def test_watch_redraws_and_exits_cleanly_on_sigint(tmp_path: Path) -> None:
    state = partial(tmp_path)
    pid, fd = pty.fork()
    if pid == 0:  # child: the dashboard in a pseudo-terminal
        os.chdir(ROOT)
        # SIGINT's default, whatever we inherited (nohup and background jobs ignore it,
        # and an ignored signal stays ignored across exec): the test stops it with one.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.execve(sys.executable, [sys.executable, "-m", "autopilot.views.dashboard.cli",
                                   "--state-dir", str(state), "--watch", "0.2", "--no-color"],
                  cli_env(TERM="xterm", COLUMNS="120", LINES="60"))
    out = b""
    try:
        while b"refresh #2" not in out:
            ready, _, _ = select.select([fd], [], [], 30)
            assert ready, f"no second refresh; got {out[-500:]!r}"
            out += os.read(fd, 65536)
        os.kill(pid, signal.SIGINT)
        deadline = time.monotonic() + 15  # bounded: a child that ignores SIGINT redraws on
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 10)
            if not ready:
                break
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
    finally:
        status = reap_or_kill(pid, 15)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert b"Traceback" not in out and b"t_alpha" in out


@pytest.mark.slow
def test_against_a_live_demo_run(state_dir: Path, tmp_path: Path) -> None:
    over = write_overlay(tmp_path / "o.json", {"vars": {"think_secs": "0.3"}})
    proc = spawn_cli("--preset", "demo", "--target-n", "2", "--config", str(over),
                     "--state-dir", str(state_dir), "--quiet")
    try:
        def mid():
            evs = events(state_dir)
            done = sum(e["event"] == "cell_verdict" for e in evs)
            s = state_dir / "status.json"
            running = json.loads(s.read_text())["totals"]["running"] if s.exists() else 0
            return done >= 2 and running >= 1

        wait_for(mid, 90, "a run in progress")
        grid = dash("--state-dir", str(state_dir), "--no-color", "--width", "120")
        assert grid.returncode == 0 and "run:pass1" in grid.stdout and " R" in grid.stdout
        js = json.loads(dash("--state-dir", str(state_dir), "--json").stdout)
        assert js["arms"]["demo-nothink"]["totals"]["valid"] >= 1
        one = dash("--state-dir", str(state_dir), "--oneline")
        assert one.stdout.startswith("run:pass1 demo ")
        assert proc.wait(120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("fixture", [partial, complete, trust])
def test_html_snapshots(tmp_path: Path, fixture) -> None:
    state = fixture(tmp_path)
    page = tmp_path / "page.html"
    assert dash("--state-dir", str(state), "--html", str(page)).returncode == 0
    html = re.sub(r"generated \S+ · read-only view of \S+", "generated <t> · read-only view of <d>",
                  page.read_text())
    check_golden(f"dash-{state.name}-html", html)


@pytest.mark.parametrize(("status", "caveat", "masked", "wide", "compact"), [
    ("FAIL", "timed out", False, "Ft", "F"),
    ("FAIL", "looped", False, "Fl", "F"),
    ("FAIL", "context exceeded", True, "Fo*", "f"),
    ("FAIL", "no deliverable", False, "F+", "F"),  # a grader word's own caveat
    ("FAIL", None, False, "F", "F"),
    ("PASS", "timed out", False, "P", "P"),  # only a FAIL carries the mark
])
def test_a_fail_with_a_caveat_is_marked_in_the_grid(status: str, caveat: str | None,
                                                    masked: bool, wide: str,
                                                    compact: str) -> None:
    from autopilot.state.ledger import CellState
    from autopilot.views.dashboard import analysis

    c = CellState("t_a_v1", "t", "a", 1, status=status, caveat=caveat,  # type: ignore[arg-type]
                  teardown_masked=masked)
    assert (analysis.code(c), analysis.compact_code(c)) == (wide, compact)


def test_the_trust_line_counts_every_invalid_attempt_as_validate_does() -> None:
    # A grader_unavailable cell is INVALID 1 in validate and the report; it spends no
    # retry, and the line says both rather than "invalid attempts 0 (grader_unavailable 1)".
    from autopilot.state.ledger import Trust
    from autopilot.views.dashboard.term import trust_line

    line = trust_line(Trust(valid_cells=3, invalid_cells=1, invalid_attempts=0,
                            invalid_by_reason={"grader_unavailable": 1}))
    assert "invalid attempts 1 (grader_unavailable 1), 0 spending a retry" in line
    same = trust_line(Trust(invalid_attempts=2, invalid_by_reason={"stall": 2}))
    assert "invalid attempts 2 (stall 2) | " in same
