"""Adversary: does the whole cell like the demo harness, then never exits (hung teardown)."""

import sys
import time

from autopilot.demo.harness import main

main(sys.argv[1:])
print("outputs written; now hanging in teardown", flush=True)
while True:
    time.sleep(3600)
