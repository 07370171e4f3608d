"""Adversary: ignores SIGTERM, double-forks a grandchild that calls setsid (escaping the
process group and the parent chain), prints the pids it made, then sleeps forever."""

import os
import signal
import time

signal.signal(signal.SIGTERM, signal.SIG_IGN)
r, w = os.pipe()
if os.fork() == 0:  # child
    os.setsid()
    if os.fork() == 0:  # grandchild: re-parented away once the child exits
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.write(w, f"{os.getpid()}\n".encode())
        while True:
            time.sleep(3600)
    os._exit(0)
os.close(w)
grandchild = os.read(r, 64).decode().strip()
print(f"READY {os.getpid()} {grandchild}", flush=True)
while True:
    time.sleep(3600)
