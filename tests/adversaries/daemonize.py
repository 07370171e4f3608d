"""Adversary: leaves a double-forked, setsid daemon behind (re-parented away from the
harness), then does the cell like the demo harness and exits normally. The daemon's pid
goes to $DAEMON_PIDFILE before the harness continues (a handshake, not a sleep)."""

import os
import sys
import time

from autopilot.demo.harness import main

r, w = os.pipe()
child = os.fork()
if child == 0:
    os.setsid()
    if os.fork() == 0:  # the daemon: its parent exits at once, so it is an orphan
        os.close(r)
        os.write(w, str(os.getpid()).encode())
        os.close(w)
        time.sleep(3600)
    os._exit(0)
os.close(w)
daemon = os.read(r, 32).decode()
os.waitpid(child, 0)
with open(os.environ["DAEMON_PIDFILE"], "w") as f:
    f.write(daemon)
main(sys.argv[1:])
