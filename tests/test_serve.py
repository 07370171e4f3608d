"""``dashboard --serve``: a real HTTP client watches a live run update in place, the
state dir stays byte-identical, per-cell pages render at phone width in a real browser
with hostile content inert, a token guards it, and /metrics and the supervisor's
textfile pass promtool with the journal's counts."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import DEMO_ARGS, ROOT, chromium, cli_env, events, run_cli, wait_for, write_overlay

PROMTOOL = shutil.which("promtool")
TOKEN = "s3cret-token-0123456789abcdef"
PHONE = "390,844"  # a phone's viewport


@pytest.fixture
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """``dashboard --serve`` on a free loopback port over tmp_path/state (which need not
    exist yet); yields (base URL, state dir)."""
    state = tmp_path / "state"
    extra = list(getattr(request, "param", []))
    if "TOKEN_FILE" in extra:
        (tmp_path / "token").write_text(TOKEN + "\n")
        extra[extra.index("TOKEN_FILE")] = str(tmp_path / "token")
    p = subprocess.Popen([sys.executable, "-m", "autopilot.views.dashboard.cli", "--state-dir",
                          str(state), "--serve", "--bind", "127.0.0.1:0", *extra],
                         env=cli_env(), cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()  # handshake: it says where it listens
        url = re.search(r"(http://127\.0\.0\.1:\d+/)", line)
        assert url, line
        yield url.group(1), state
    finally:
        p.send_signal(signal.SIGINT)
        p.wait(10)


def tree(state: Path) -> dict[str, str]:
    return {str(p.relative_to(state)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(state.rglob("*")) if p.is_file()}


def metric(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in
                                                labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} {labels} not in metrics")


@pytest.mark.slow
def test_a_live_run_updates_in_place_and_nothing_is_written(server, tmp_path: Path) -> None:
    url, state = server
    assert "no run yet" in httpx.get(url).text  # started before the state dir exists
    prom = tmp_path / "autopilot.prom"
    over = write_overlay(tmp_path / "o.json", {"vars": {"think_secs": "0.3"}})
    run = subprocess.Popen([sys.executable, "-m", "autopilot.cli", "--preset", "demo",
                            "--target-n", "2", "--config", str(over), "--state-dir", str(state),
                            "--quiet", "--metrics-textfile", str(prom)],
                           env=cli_env(AUTOPILOT_HEARTBEAT_SECS="0.3"), cwd=ROOT,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seen: list[str] = []
    try:
        with httpx.stream("GET", url + "events", timeout=120) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            block: list[str] = []
            for line in r.iter_lines():
                if line.startswith("data: "):
                    block.append(line[6:])
                elif not line and block:
                    seen.append("\n".join(block))
                    block = []
                    done = re.search(r"trust: valid (\d+)", seen[-1])
                    if done and int(done.group(1)) >= 6:
                        break
        counts = [int(m.group(1)) for s in seen if (m := re.search(r"trust: valid (\d+)", s))]
        assert len(set(counts)) >= 3 and counts == sorted(counts)  # updates as cells finish
        assert 'href="cell/' in seen[-1]

        os.kill(run.pid, signal.SIGSTOP)
        wait_for(lambda: httpx.get(url + "status.json").json()["liveness"]["state"] ==
                 "stale", what="STALE in /status.json")
        assert metric(httpx.get(url + "metrics").text, "autopilot_stale", preset="demo") == 1
        assert "STALE (heartbeat" in httpx.get(url).text
        os.kill(run.pid, signal.SIGCONT)
        wait_for(lambda: httpx.get(url + "status.json").json()["liveness"]["state"] in
                 ("live", "finished"), what="recovery after SIGCONT")
        assert run.wait(180) == 0
    finally:
        if run.poll() is None:
            os.kill(run.pid, signal.SIGCONT)
            run.kill()
            run.wait()
    before = tree(state)
    page = httpx.get(url)
    assert page.status_code == 200 and "COMPLETE" in page.text
    cell = re.search(r'href="cell/([^"]+)"', page.text).group(1)
    assert httpx.get(url + f"cell/{cell}").status_code == 200
    status = httpx.get(url + "status.json").json()
    text = httpx.get(url + "metrics").text
    assert tree(state) == before  # read-only: byte-identical

    verdicts: dict[str, str] = {}
    for ev in events(state):
        if ev["event"] == "cell_verdict":
            verdicts[ev["cell"]] = ev["verdict"]
    for arm in ("demo-nothink", "demo-think"):
        for state_label, word in (("pass", "PASS"), ("fail", "FAIL")):
            want = sum(1 for c, v in verdicts.items() if v == word and f"_{arm}_v" in c)
            assert metric(text, "autopilot_cells", arm=arm, state=state_label) == want
    assert status["phase"] == "COMPLETE"
    assert metric(text, "autopilot_stale", preset="demo") == 0
    textfile = prom.read_text()
    assert metric(textfile, "autopilot_cells", arm="demo-think", state="pass") == \
        metric(text, "autopilot_cells", arm="demo-think", state="pass")
    if PROMTOOL is None:
        pytest.skip("promtool is not installed (tools/test installs Debian's prometheus)")
    for body in (text, textfile):
        r = subprocess.run([PROMTOOL, "check", "metrics"], input=body, text=True,
                           capture_output=True)
        assert r.returncode == 0, r.stdout + r.stderr


HOSTILE_TRANSCRIPT = (
    "import json, os, sys; out = sys.argv[1]; os.makedirs(out, exist_ok=True); "
    "open(os.path.join(out, 'transcript.jsonl'), 'wb').write("
    "b'<script>document.body.dataset.pwned=1</script> <a href=\"javascript:alert(1)\">x</a>'"
    " b' \\x1b[31mred\\x1b]8;;javascript:alert(2)\\x1b\\\\ \\xff\\xfe bad utf-8\\n'); "
    "print('<img src=x onerror=\"document.body.dataset.pwned=2\">\\x1b[2J', flush=True); "
    "os.execv(sys.executable, [sys.executable, '-m', 'autopilot.demo.harness', *sys.argv[2:]])")

@pytest.mark.slow
def test_phone_width_pages_render_and_hostile_content_is_inert(server, tmp_path: Path) -> None:
    url, state = server
    over = write_overlay(tmp_path / "o.json", {
        "tasks": [{"id": "p1_bugfix"}], "arms": [{"label": "demo-nothink", "mode": "nothink"}],
        "harness": {"argv": ["{python}", "-c", HOSTILE_TRANSCRIPT, "{output_dir}",
                             *DEMO_ARGS]}})
    assert run_cli("--preset", "demo", "--target-n", "2", "--config", str(over),
                   "--state-dir", str(state), "--quiet").returncode == 0
    shot = tmp_path / "grid.png"
    chromium(tmp_path, url, f"--screenshot={shot}", width=PHONE)
    assert shot.stat().st_size > 1000 and shot.read_bytes()[:4] == b"\x89PNG"
    grid = chromium(tmp_path, url, "--dump-dom", width=PHONE).stdout
    assert '<table class="grid" data-arm="demo-nothink">' in grid
    cell_url = url + "cell/p1_bugfix_demo-nothink_v1"
    raw = httpx.get(cell_url)
    assert "Content-Security-Policy" in raw.headers and "\x1b" not in raw.text
    assert "<script>" not in raw.text and "<img" not in raw.text
    assert not re.search(r"""(src|href)=["']?(https?:|//|javascript:)""", raw.text)
    dom = chromium(tmp_path, cell_url, "--dump-dom", width=PHONE).stdout
    assert '<p class="verdict pass" id="verdict">PASS</p>' in dom or 'id="verdict">FAIL' in dom
    assert "&lt;script&gt;document.body.dataset.pwned=1&lt;/script&gt;" in dom  # as text
    assert not re.search(r"<body[^>]*data-pwned", dom)  # no script ran
    assert not re.search(r"<a\s[^>]*href=\"javascript:", dom)  # no live link (text only)
    assert "bad utf-8" in dom and "\ufffd" in dom  # invalid UTF-8 shown replaced
    # what the cell asked the model, as the gateway recorded it
    assert "model requests, attempt 1 (gateway)" in dom and "/v1/chat/completions" in dom
    chromium(tmp_path, cell_url, f"--screenshot={tmp_path / 'cell.png'}", width=PHONE)
    assert (tmp_path / "cell.png").stat().st_size > 1000
    assert httpx.get(url + "cell/..%2F..%2Fetc%2Fpasswd").status_code == 404
    assert httpx.get(url + "cell/nope_demo-nothink_v9").status_code == 404


def test_a_non_loopback_bind_needs_a_token(tmp_path: Path) -> None:
    r = run_cli("--state-dir", str(tmp_path), "--serve", "--bind", "192.0.2.1:8765",
                prog="dashboard")  # refused before anything binds
    assert r.returncode == 2 and "--token-file is required" in r.stderr
    short = tmp_path / "short"
    short.write_text("abc\n")
    r = run_cli("--state-dir", str(tmp_path), "--serve", "--token-file", str(short),
                prog="dashboard")
    assert r.returncode == 2 and "at least 16 characters" in r.stderr


@pytest.mark.parametrize("server", [["--token-file", "TOKEN_FILE"]], indirect=True)
def test_with_a_token_requests_without_it_get_401(server) -> None:
    url, _ = server
    for path in ("", "status.json", "metrics", "events", "static/app.js"):
        assert httpx.get(url + path).status_code == 401
    assert httpx.get(url, headers={"Authorization": "Bearer wrong"}).status_code == 401
    port = int(url.rsplit(":", 1)[1].strip("/"))
    for header in (b"Authorization: Bearer \xff\xfe", b"Cookie: autopilot_token=\xc3\x28"):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            raw.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n" + header +
                        b"\r\nConnection: close\r\n\r\n")
            head = raw.recv(64)
        assert head.split()[1] == b"401", head  # bytes that are no text: no token, no 500
    ok = httpx.get(url, headers={"Authorization": f"Bearer {TOKEN}"})
    assert ok.status_code == 200
    with httpx.Client() as c:  # ?token= once, then the HttpOnly cookie
        first = c.get(url + f"?token={TOKEN}")
        assert first.status_code == 200 and "HttpOnly" in first.headers["set-cookie"]
        assert c.get(url + "metrics").status_code in (200, 404)  # 404: no run yet
