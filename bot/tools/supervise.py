"""Leads a shell command's process group and takes it down with Tandem.

Run as a script: `python -S -I supervise.py COMMAND TANDEM_PID`. The kernel sends it
SIGTERM when Tandem dies (even by SIGKILL), and it then kills the whole group, so no
tool process, grandchildren included, outlives Tandem.
"""

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def die(*_: object) -> None:
    os.killpg(0, signal.SIGKILL)


def main() -> int:
    command, parent = sys.argv[1], int(sys.argv[2])
    signal.signal(signal.SIGTERM, die)
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # Tandem died before the death signal was armed
        die()
    pid = os.fork()
    if pid == 0:
        os.execv("/bin/sh", ["sh", "-c", command])
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) % 256


if __name__ == "__main__":
    sys.exit(main())
