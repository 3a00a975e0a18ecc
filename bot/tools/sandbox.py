"""The shell's sandbox: how a command is run under bubblewrap (`bwrap`), and whether it can be.

Inside, the system is read-only and the workspace the only writable folder; /tmp and /run
are private and empty; Tandem's config, `.env`, database and persona, and the paths of
`tools.shell.hide`, are shown empty; the command has no network unless its call asks for
it, its own process namespace (a fresh /proc: Tandem and every other process are out of
sight), no capabilities, a clean environment, and dies with Tandem. Its memory and
process limits are set by the supervisor (`bot.tools.supervise`) before bwrap starts.

`sandboxed` is a policy for the shell: it runs without asking inside the sandbox and asks
for a call outside it (no sandbox configured) or with the network on.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bot.core.tools_config import ShellConfig

KEPT_ENV = ("PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TERM", "TZ")
"""What the command's environment keeps of the (already clean) tool environment."""
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
RESOLVER = "/run/systemd/resolve"
"""Kept under the private /run: /etc/resolv.conf often points here (for `network: true`)."""
CHECK_TIMEOUT_S = 10.0
USERNS_HELP = (
    "bubblewrap needs user namespaces: the kernel must let this user create them "
    "(`sysctl user.max_user_namespaces` above 0; on Debian before 11 "
    "`sysctl kernel.unprivileged_userns_clone=1`; on Ubuntu 24.04 and later an AppArmor "
    "profile for bwrap, or `sysctl kernel.apparmor_restrict_unprivileged_userns=0`), and a "
    "container must be allowed to create them (Docker's default seccomp profile refuses "
    "`unshare`: run it with a profile that allows it)")


def enabled(config: Any) -> bool:
    return isinstance(config, ShellConfig) and config.sandbox == "bwrap"


def wants_network(args: dict[str, Any]) -> bool:
    return args.get("network") is True


def policy(policy: str, tool: str, config: ShellConfig, args: dict[str, Any]) -> str:
    """What `sandboxed` means for this call: `allow` for a shell command that runs in the
    sandbox without the network, `ask` for any other call. Other policies are unchanged."""
    if policy != "sandboxed":
        return policy
    if tool == "shell" and enabled(config) and not wants_network(args):
        return "allow"
    return "ask"


def limits(config: ShellConfig) -> str:
    """The supervisor's limits argument, `data=BYTES,nproc=N` (what is unset left out)."""
    parts = []
    if config.memory_mb is not None:
        parts.append(f"data={config.memory_mb * 1024 * 1024}")
    if config.processes is not None:
        parts.append(f"nproc={config.processes}")
    return ",".join(parts)


def hidden(protected: Iterable[Path], config: ShellConfig, workspace: Path,
           *folders: Path) -> list[Path]:
    """What the sandbox shows empty: Tandem's protected files (config, `.env`, database),
    `folders` (the persona's and the database's, unless the workspace is in one) and
    `tools.shell.hide`."""
    ws = workspace.resolve()
    kept = [f.resolve() for f in folders if not ws.is_relative_to(f.resolve())]
    return [*(p.resolve() for p in protected), *kept, *_expanded(config.hide)]


def _expanded(paths: Iterable[str]) -> list[Path]:
    """`~` made the home folder (a `~` path is left out where there is no home)."""
    out = []
    for path in paths:
        try:
            out.append(Path(path).expanduser().resolve())
        except RuntimeError:
            continue
    return out


def argv(config: ShellConfig, workspace: Path, env: dict[str, str], *, network: bool,
         hide: Iterable[Path] = ()) -> list[str]:
    """The bwrap command line that runs what follows it (`sh -c COMMAND`) in the sandbox."""
    ws = workspace.resolve()
    masks = _masks(ws, [Path("/tmp"), Path("/run"), *hide])
    before = [m for m in masks if ws.is_relative_to(m[1])]
    after = [m for m in masks if not ws.is_relative_to(m[1])]
    out = [config.bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    for kind, path in before:
        out += _mask(kind, path)
    out += ["--bind", str(ws), str(ws)]
    for kind, path in after:
        out += _mask(kind, path)
    if Path(RESOLVER).is_dir():
        out += ["--ro-bind", RESOLVER, RESOLVER]
    out += ["--chdir", str(ws), "--unshare-user", "--unshare-pid", "--unshare-ipc",
            "--unshare-uts", "--unshare-cgroup-try", *([] if network else ["--unshare-net"]),
            "--cap-drop", "ALL", "--die-with-parent", "--new-session", "--clearenv"]
    for key, value in environment(ws, env).items():
        out += ["--setenv", key, value]
    return [*out, "--"]


def environment(workspace: Path, env: dict[str, str]) -> dict[str, str]:
    """The command's whole environment (and bwrap's own, which its /proc shows): the
    search path, the locale, the terminal and the time zone of `env`, the workspace as
    home, and /tmp."""
    kept = {k: env[k] for k in KEPT_ENV if k in env}
    kept.setdefault("PATH", DEFAULT_PATH)
    return kept | {"HOME": str(workspace.resolve()), "TMPDIR": "/tmp"}


def _masks(ws: Path, paths: list[Path]) -> list[tuple[str, Path]]:
    """(dir | file, path) for each existing path to show empty, outermost first, leaving
    out the workspace and what an earlier folder already hides (a folder around the
    workspace hides all but the workspace: what is in the workspace is masked again)."""
    found: list[tuple[str, Path]] = []
    for path in sorted(set(paths), key=lambda p: len(p.parts)):
        if path == ws or not path.exists():
            continue
        if any(path.is_relative_to(d) and not (ws.is_relative_to(d) and path.is_relative_to(ws))
               for kind, d in found if kind == "dir"):
            continue
        found.append(("dir" if path.is_dir() else "file", path))
    return found


def _mask(kind: str, path: Path) -> list[str]:
    if kind == "dir":
        return ["--tmpfs", str(path)]
    return ["--ro-bind", os.devnull, str(path)]


def check(config: ShellConfig) -> str | None:
    """Why the sandbox cannot run here (None when a `true` runs in it)."""
    with tempfile.TemporaryDirectory(prefix="tandem-sandbox-check-") as ws:
        command = [*argv(config, Path(ws), {"PATH": os.environ.get("PATH", DEFAULT_PATH)},
                         network=False), "true"]
        try:
            done = subprocess.run(command, capture_output=True, text=True,
                                  timeout=CHECK_TIMEOUT_S, check=False)
        except FileNotFoundError:
            return (f"`{config.bwrap}` was not found: install bubblewrap (Debian's and "
                    "Ubuntu's `bubblewrap` package) or set tools.shell.bwrap")
        except PermissionError:
            return f"`{config.bwrap}` cannot be run by this user"
        except subprocess.TimeoutExpired:
            return f"`{config.bwrap}` did not finish a `true` within {CHECK_TIMEOUT_S:g} s"
    if done.returncode == 0:
        return None
    said = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
    return f"`{config.bwrap}` failed ({said}); {USERNS_HELP}"
