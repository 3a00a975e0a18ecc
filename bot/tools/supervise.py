"""Leads a shell command's process group and takes it down with Tandem.

Run as a script: `python -S -I supervise.py COMMAND TANDEM_PID [LIMITS [WRAPPER...]]`.
The kernel sends it SIGTERM when Tandem dies (even by SIGKILL), and it then kills the
whole group, so no tool process, grandchildren included, outlives Tandem. LIMITS
(`data=BYTES,nproc=N`) are set on the command before it starts; WRAPPER (the sandbox's
command line) runs `sh -c COMMAND` in its place.
"""

import ctypes
import os
import resource
import signal
import sys

PR_SET_PDEATHSIG = 1
LIMITS = {"data": resource.RLIMIT_DATA, "nproc": resource.RLIMIT_NPROC}


def die(*_: object) -> None:
    os.killpg(0, signal.SIGKILL)


def limit(spec: str) -> None:
    for part in filter(None, spec.split(",")):
        name, _, value = part.partition("=")
        resource.setrlimit(LIMITS[name], (int(value), int(value)))


def main() -> int:
    command, parent, *rest = sys.argv[1:]
    signal.signal(signal.SIGTERM, die)
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != int(parent):  # Tandem died before the death signal was armed
        die()
    pid = os.fork()
    if pid == 0:
        try:
            if rest:
                limit(rest[0])
            if rest[1:]:
                os.execvp(rest[1], [*rest[1:], "/bin/sh", "-c", command])
            os.execv("/bin/sh", ["sh", "-c", command])
        except OSError as exc:
            os.write(2, f"tandem: cannot start the command: {exc}\n".encode())
        os._exit(127)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) % 256


if __name__ == "__main__":
    sys.exit(main())
