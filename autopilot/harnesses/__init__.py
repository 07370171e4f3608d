"""Shipped harness programs for frameworks people already use (Inspect): each runs as
a cell's child process, never inside the supervisor, and imports its framework only
there (the ``inspect`` extra)."""
