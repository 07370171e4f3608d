"""bench-autopilot: a self-healing supervisor for long LLM benchmark runs."""

__version__ = "0.1.0"
