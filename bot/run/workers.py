"""`tandem run --workers N`: N worker processes on one PostgreSQL database, supervised.

Each worker is a `tandem run` of its own (the same config). A worker that dies is
started again after a second; SIGINT or SIGTERM stops them all (each finishes or cancels
its turns as one `tandem run` does) and waits for them.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from types import FrameType

from bot.run import hidden

log = logging.getLogger("tandem")
RESTART_AFTER_S = 1.0
STOP_WAIT_S = 15.0


def supervise(count: int, config: str | None, verbose: bool) -> int:
    hidden.hide()  # it holds the same environment as its workers
    command = [sys.executable, "-m", "bot", *(["--config", config] if config else []),
               *(["-v"] if verbose else []), "run"]
    stopping = False

    def stop(_sig: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    def spawn(slot: int) -> subprocess.Popen[bytes]:
        # the slot names the worker's tool processes, so its next run finds what it left
        return subprocess.Popen(command, env={**os.environ, "TANDEM_WORKER": str(slot)})

    workers = [spawn(slot) for slot in range(1, count + 1)]
    log.info("tandem: %d workers started (pids %s)", count, [w.pid for w in workers])
    while not stopping:
        time.sleep(0.2)
        for i, worker in enumerate(workers):
            if worker.poll() is not None and not stopping:
                log.warning("tandem: worker %d exited with %s; starting it again", worker.pid,
                            worker.returncode)
                time.sleep(RESTART_AFTER_S)
                workers[i] = spawn(i + 1)
    for worker in workers:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_WAIT_S
    for worker in workers:
        try:
            worker.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
    return 0
