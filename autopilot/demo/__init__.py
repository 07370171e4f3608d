"""The embedded demo: a SIMULATED endpoint, a demo harness and a demo grader.

Nothing here talks to a real model. ``endpoint`` is an honest fake of an OpenAI-compatible
server (``/health``, ``/v1/models``, ``/v1/chat/completions``) whose answers are a
deterministic function of (seed, task, arm, replicate); ``harness`` drives it over real
HTTP like a benchmark harness would; ``grader`` grades the deliverable. Fault knobs
(endpoint crash, hanging harnesses, a grader failure streak) let ``demo-chaos`` show the
supervisor healing itself. Tests use the same pieces.
"""

import hashlib


def unit(*parts: object) -> float:
    """A deterministic number in [0, 1) from the parts (seeded, stable across runs)."""
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


# Per-task chance that the simulated model gets the answer right, so the scorecard is
# not trivial: some tasks always pass, some never, most in between.
PASS_RATE = {
    "p1_bugfix": 0.95, "p1_testwrite": 0.05, "p1_refactor": 0.2, "p2_extract": 0.9,
    "p2_ci": 0.85, "p2_hallucination": 0.9, "p2_triage": 0.8, "p3_doc": 0.75,
    "p3_business": 0.9, "p3_market": 0.6, "p3_writing": 0.1, "p3_pm": 0.5,
}
