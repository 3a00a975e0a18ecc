"""What the shell's bubblewrap sandbox adds to the start of each command.

    python benchmarks/sandbox_bench.py [--runs 200] [--json out.json]

The real `shell` tool runs `true` `--runs` times without the sandbox and `--runs` times
with it (`tools.shell.sandbox: bwrap`, the default limits), alternating, each call's
wall time measured from the call to its result; a few calls of each are run first to
warm up. Printed: the median and p95 of each, and the difference of the medians and of
the p95s (and of the fastest calls, the least a busy machine's scheduler adds): the time
the sandbox adds per call. Also the bare bwrap command line alone
(`bwrap … true` against `true`, through `subprocess.run`), which is the sandbox without
Tandem's supervisor around it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bot.core.tools_config import ShellConfig  # noqa: E402
from bot.tools import ToolContext, sandbox  # noqa: E402
from bot.tools.shell import clean_env, shell  # noqa: E402

WARM_UP = 5


def stats(samples: list[float]) -> tuple[float, float, float]:
    """(median, p95, fastest) in milliseconds."""
    ordered = sorted(samples)
    return (statistics.median(ordered) * 1000,
            ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))] * 1000,
            ordered[0] * 1000)


async def tool_calls(workspace: Path, runs: int) -> dict[str, list[float]]:
    env = clean_env(dict(os.environ), [])
    contexts = {
        "plain": ToolContext(workspace=workspace, protected=frozenset(), env=env),
        "sandbox": ToolContext(workspace=workspace, protected=frozenset(), env=env,
                               extras={"shell": ShellConfig(sandbox="bwrap")}),
    }
    times: dict[str, list[float]] = {name: [] for name in contexts}
    for i in range(WARM_UP + runs):
        for name, ctx in contexts.items():
            start = time.perf_counter()
            await shell(ctx, {"command": "true"})
            if i >= WARM_UP:
                times[name].append(time.perf_counter() - start)
    return times


def bare(workspace: Path, runs: int) -> dict[str, list[float]]:
    config = ShellConfig(sandbox="bwrap")
    wrapped = [*sandbox.argv(config, workspace, dict(os.environ), network=False), "true"]
    commands = {"plain": ["true"], "sandbox": wrapped}
    times: dict[str, list[float]] = {name: [] for name in commands}
    for i in range(WARM_UP + runs):
        for name, argv in commands.items():
            start = time.perf_counter()
            subprocess.run(argv, check=True)
            if i >= WARM_UP:
                times[name].append(time.perf_counter() - start)
    return times


def report(title: str, times: dict[str, list[float]]) -> dict[str, float]:
    plain, boxed = stats(times["plain"]), stats(times["sandbox"])
    figures = {"plain_p50_ms": plain[0], "plain_p95_ms": plain[1],
               "sandbox_p50_ms": boxed[0], "sandbox_p95_ms": boxed[1],
               "added_p50_ms": boxed[0] - plain[0], "added_p95_ms": boxed[1] - plain[1],
               "added_fastest_ms": boxed[2] - plain[2]}
    print(f"{title}:")
    print(f"  without the sandbox  p50 {plain[0]:6.2f} ms   p95 {plain[1]:6.2f} ms   "
          f"fastest {plain[2]:6.2f} ms")
    print(f"  with the sandbox     p50 {boxed[0]:6.2f} ms   p95 {boxed[1]:6.2f} ms   "
          f"fastest {boxed[2]:6.2f} ms")
    print(f"  added per call       p50 {figures['added_p50_ms']:+6.2f} ms   "
          f"p95 {figures['added_p95_ms']:+6.2f} ms   "
          f"fastest {figures['added_fastest_ms']:+6.2f} ms")
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    why = sandbox.check(ShellConfig(sandbox="bwrap"))
    if why is not None:
        print(f"the sandbox cannot run here: {why}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="tandem-sandbox-bench-") as tmp:
        workspace = Path(tmp)
        load = os.getloadavg()[0]
        print(f"{args.runs} runs of `true` each, alternating (load average {load:.1f} on "
              f"{os.cpu_count()} cores at the start)")
        figures = {"tool": report("the shell tool (supervisor included)",
                                  asyncio.run(tool_calls(workspace, args.runs))),
                   "bare": report("bwrap's command line alone", bare(workspace, args.runs))}
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
