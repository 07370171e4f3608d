"""Read-only views over a state dir: never writes there, never takes the lock."""
