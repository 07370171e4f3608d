"""Agent CLIs as their vendors ship them, as harnesses (issue #43): Claude Code, Codex CLI,
Gemini CLI and opencode (pinned, from npm: tools/install-agents), each running real cells
through the autopilot and its gateway — against FAKE vendors on 127.0.0.1
(autopilot/demo/vendor.py, one per route), and Claude Code and Codex CLI against the
real llama-server + 270M GGUF too (its Anthropic Messages and Responses endpoints).
Skipped, saying why, only where the CLIs (or the model) are not installed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, cli_env, events, run_cli
from test_real_llama import _available as _llama
from vendors import Vendor, agents_bin

pytestmark = [pytest.mark.slow]

PRESET = str(ROOT / "tests" / "presets" / "agents-fakes.toml")
KEYS = {"messages": "sk-ant-REAL-0001", "responses": "sk-oai-REAL-0002",
        "gemini": "AIza-REAL-0003", "chat": "sk-or-REAL-0004"}
KEY_ENV = {"messages": "ANTHROPIC_API_KEY", "responses": "OPENAI_REAL_KEY",
           "gemini": "GEMINI_REAL_KEY", "chat": "OPENROUTER_API_KEY"}
URL_ENV = {"messages": "MESSAGES_URL", "responses": "RESPONSES_URL",
           "gemini": "GEMINI_URL", "chat": "AGGREGATOR_URL"}
PATH = {"messages": "", "responses": "/v1", "gemini": "", "chat": "/v1"}
ARM = {"messages": "claude-native", "responses": "codex-native", "gemini": "gemini-native",
       "chat": "opencode-kernel"}
MODELS = {"messages": "claude-sonnet-4-5,claude-opus-4-1",
          "responses": "gpt-5,gpt-5-mini", "gemini": "gemini-2.5-pro,gemini-2.5-flash",
          "chat": "anthropic/claude-sonnet-4.5,openai/gpt-5"}


@pytest.fixture(autouse=True)
def need_agents() -> None:
    if agents_bin() is None:
        pytest.skip("agent CLIs not installed (tools/install-agents)")


def start(tmp: Path, *args: str, keys: dict[str, str] | None = None,
          models: dict[str, str] | None = None) -> dict[str, Vendor]:
    out: dict[str, Vendor] = {}
    try:
        for d in KEYS:
            out[d] = Vendor(tmp, d, (keys or KEYS)[d], (models or MODELS)[d], "--answer",
                            "Paris", *args)
    except BaseException:
        for v in out.values():
            v.close()
        raise
    return out


def env_for(vendors: dict[str, Vendor], **extra: str) -> dict[str, str]:
    env = {URL_ENV[d]: v.origin + PATH[d] for d, v in vendors.items()}
    env.update({KEY_ENV[d]: k for d, k in KEYS.items()})
    return cli_env(AUTOPILOT_AGENTS_BIN=str(agents_bin()), **env, **extra)


@pytest.fixture
def vendors(tmp_path: Path) -> Iterator[dict[str, Vendor]]:
    started = start(tmp_path)
    yield started
    for v in started.values():
        v.close()


def files_holding(root: Path, needles: set[str]) -> list[str]:
    hits = []
    for f in root.rglob("*"):
        if f.is_file() and not f.is_symlink():
            data = f.read_bytes()
            hits += [f"{f}: {n}" for n in needles if n.encode() in data]
    return hits


def test_four_agent_clis_run_cells_metered_at_the_wire_by_bucket(
        vendors: dict[str, Vendor], tmp_path: Path) -> None:
    state = tmp_path / "state"
    r = run_cli("--preset", PRESET, "--state-dir", str(state), "--quiet",
                env=env_for(vendors), timeout=400)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    evs = events(state)
    verdicts = {e["cell"]: e for e in evs if e["event"] == "cell_verdict"}
    assert {v["verdict"] for v in verdicts.values()} == {"PASS"}, verdicts
    for d, v in vendors.items():
        cell = f"capital_{ARM[d]}_v1"
        got = v.requests()
        model_calls = [q for q in got if q["billed"] is not None]
        # Each arm reached its own route only, always with the real key in the vendor's
        # own header (the fake answers 401 otherwise)
        assert model_calls and all(q["key_ok"] for q in got), (d, got)
        verdict = verdicts[cell]
        meter = next(e for e in evs if e["event"] == "cell_metered" and e["cell"] == cell)
        assert meter["requests"] == len(model_calls) and meter["unmetered"] == 0
        # the meter by bucket equals what the vendor billed, request by request
        billed = {b: sum(q["billed"][b] for q in model_calls) for b in
                  ("input", "cache_write", "cache_read", "output")}
        t = meter["tokens"]
        assert t["output"] == billed["output"] and t["input"] == billed["input"], (d, t)
        assert t.get("cache_read", 0) == billed["cache_read"]
        assert t.get("cache_write", 0) == billed["cache_write"]
        assert verdict["tokens"] == t and verdict["cost_basis"] in (
            "metered", "self_reported_mismatch")
        gw = [json.loads(x) for x in (state / "gateway" / cell / "attempt-1.jsonl")
              .read_text().splitlines() if x.strip()]
        assert {g["dialect"] for g in gw if "dialect" in g} == {d}
        # the arm's settings, in the dialect's own field, on every generation request
        bodies = [q["body"] for q in model_calls]
        field = {"messages": "thinking", "responses": "reasoning",
                 "gemini": "generationConfig", "chat": None}[d]
        if field:
            assert all(field in b for b in bodies), (d, bodies[0].keys())
        summary = json.loads((state / "cells" / cell / "summary.json").read_text())
        assert summary["finish_reason"] == "completed" and summary["agent_model"] in (
            None, summary["model"])
    # opencode leaves its session-title request out of its own count: said, not believed
    kernel = verdicts["capital_opencode-kernel_v1"]
    assert kernel["cost_basis"] == "self_reported_mismatch"
    assert kernel["self_reported"] != kernel["spend"]
    # no real key anywhere the agents or the run wrote (env, argv, files, logs)
    assert files_holding(state, set(KEYS.values())) == []
    report = run_cli("report", "--state-dir", str(state), env=env_for(vendors)).stdout
    assert "| claude-native | messages ·" in report and "buckets 1" in report
    assert "floor 1 (no price for cache_read)" in report  # the aggregator's row


def test_a_refusal_storm_is_rate_limited_never_the_models_fail(tmp_path: Path) -> None:
    vendors = start(tmp_path, "--refuse", "-1", "--refuse-status", "529")
    try:
        state = tmp_path / "state"
        over = tmp_path / "short.toml"
        over.write_text("[harness]\nwall_budget_secs = 25\n")
        r = run_cli("--preset", PRESET, "--config", str(over), "--state-dir", str(state),
                    "--max-passes", "1", "--quiet", env=env_for(vendors), timeout=400)
    finally:
        for v in vendors.values():
            v.close()
    assert r.returncode == 1, (r.stdout[-2000:], r.stderr[-2000:])
    verdicts = [e for e in events(state) if e["event"] == "cell_verdict"]
    assert len(verdicts) == 4
    assert {(e["verdict"], e["reason"]) for e in verdicts} == {("INVALID", "rate_limited")}, \
        [(e["cell"], e["verdict"], e["reason"], e["detail"][:120]) for e in verdicts]
    for v in vendors.values():
        assert v.requests() and all(q["billed"] is None for q in v.requests())


def test_preflight_refuses_a_bad_key_or_model_on_either_route_before_any_spend(
        tmp_path: Path) -> None:
    bad = {**KEYS, "chat": "sk-or-SOMETHING-ELSE"}
    vendors = start(tmp_path, keys=bad)
    try:
        r = run_cli("--preset", PRESET, "--state-dir", str(tmp_path / "s1"), "--quiet",
                    env=env_for(vendors), timeout=120)
        assert r.returncode == 2
        assert "arm 'opencode-kernel': route http://127.0.0.1" in r.stderr
        assert "rejected the key in $OPENROUTER_API_KEY (HTTP 401)" in r.stderr
        assert "sk-or-REAL" not in r.stderr
        for v in vendors.values():  # nothing but the models lists was asked
            assert all(q["billed"] is None for q in v.requests())
    finally:
        for v in vendors.values():
            v.close()
    vendors = start(tmp_path, models={**MODELS, "messages": "claude-sonnet-4-6,claude-opus-4-1"})
    try:
        r = run_cli("--preset", PRESET, "--state-dir", str(tmp_path / "s2"), "--quiet",
                    env=env_for(vendors), timeout=120)
        assert r.returncode == 2
        assert ("model 'claude-sonnet-4-5' not offered by route" in r.stderr
                and "closest: claude-sonnet-4-6" in r.stderr), r.stderr
        assert not any(v.requests() for v in vendors.values() if v.dialect != "messages")
    finally:
        for v in vendors.values():
            v.close()


@pytest.mark.real_model
def test_claude_code_and_codex_against_the_real_llama_server(tmp_path: Path) -> None:
    why = _llama()
    if why:
        pytest.skip(why)
    state = tmp_path / "state"
    r = run_cli("--preset", str(ROOT / "tests" / "presets" / "agents-llama.toml"),
                "--state-dir", str(state), "--quiet",
                env=cli_env(AUTOPILOT_AGENTS_BIN=str(agents_bin())), timeout=600)
    assert r.returncode in (0, 1), (r.stdout[-2000:], r.stderr[-3000:])
    evs = events(state)
    verdicts = {e["cell"]: e for e in evs if e["event"] == "cell_verdict"}
    assert set(verdicts) == {"banana_claude-llama_v1", "banana_codex-llama_v1"}
    for cell, dialect in (("banana_claude-llama_v1", "messages"),
                          ("banana_codex-llama_v1", "responses")):
        v = verdicts[cell]
        # the model's own answer, right or wrong: never an infrastructure verdict
        assert v["verdict"] in ("PASS", "FAIL"), v
        gw = [json.loads(x) for x in (state / "gateway" / cell / "attempt-1.jsonl")
              .read_text().splitlines() if x.strip()]
        answered = [g for g in gw if g.get("status") == 200 and g.get("dialect") == dialect]
        assert answered and all("tokens" in g for g in answered), gw[:3]
        total: dict[str, Any] = {}
        for g in answered:
            for b, n in g["tokens"].items():
                total[b] = total.get(b, 0) + n
        assert v["tokens"]["output"] == total["output"] > 0
        assert v["tokens"]["input"] + v["tokens"].get("cache_read", 0) == (
            total["input"] + total.get("cache_read", 0)) > 0
        assert not [g for g in gw if g.get("unmetered")]  # Codex hangs up at its last event
        summary = json.loads((state / "cells" / cell / "summary.json").read_text())
        claimed = summary["self_reported"]
        if dialect == "messages":
            assert all(g["applied"] == {"max_tokens": 48} for g in answered)
            # Claude Code's own count of what llama-server told it equals the wire's
            assert v["cost_basis"] == "metered", (v, claimed)
            assert claimed["output"] == total["output"]
