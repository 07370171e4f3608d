"""Presets shipped with bench-autopilot (TOML files; this file only makes them a package)."""
