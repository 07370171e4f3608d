"""The shipped presets load and have the origin's shape (the MMBT ones are driven end to
end against an origin-shaped checkout in test_mmbt.py)."""

from __future__ import annotations

from autopilot.loader import list_presets, load_preset
from autopilot.plan import Plan, arm_groups

SHIPPED = ["demo", "demo-chaos", "397b", "qwen3.6-27b", "step3p7", "provider-example"]


def test_every_shipped_preset_loads() -> None:
    names = [n for n, _ in list_presets()]
    assert set(SHIPPED) <= set(names) and "_mmbt" not in names
    for name in SHIPPED:
        p = load_preset(name)
        assert Plan(p, 2).cells and p.description


def test_origin_presets_shape() -> None:
    p = load_preset("397b")
    assert p.endpoint.engine == "llamacpp" and p.endpoint.mode == "docker"
    assert [a.label for a in p.arms] == ["397b-nothink", "397b-think"]
    assert len(p.tasks) == 12 and p.baseline and sum(p.baseline.passes.values()) == 82
    assert p.harness.sandbox_container == "bench-sandbox-{cell}"
    assert load_preset("step3p7").endpoint.engine == "vllm"
    assert load_preset("provider-example").endpoint.engine == "provider"
    # the mode of each arm acts where this harness lets it: in each request (the
    # gateway adds it), so both arms share one endpoint and one model load
    for name in ("397b", "qwen3.6-27b"):
        arms = load_preset(name).arms
        assert [a.request["chat_template_kwargs"]["enable_thinking"] for a in arms] == [
            False, True]
        assert len(arm_groups(load_preset(name))) == 1
    step = load_preset("step3p7")
    assert [a.request["chat_template_kwargs"]["reasoning_effort"] for a in step.arms] == [
        "low", "medium", "high"]
    assert len(arm_groups(step)) == 1
    assert not p.harness.env  # the real harness reads no thinking variable
