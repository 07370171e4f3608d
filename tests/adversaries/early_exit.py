"""Adversary: dies at once, writing nothing."""

import sys

print("boom", flush=True)
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
