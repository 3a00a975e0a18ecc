"""What a command that prints a lot costs Tandem: peak RSS and time of one shell call.

    python benchmarks/shell_output_bench.py [--mb 200] [--runs 3] [--tree PATH] [--no-litellm]
                                            [--json out.json]

Each run is a fresh Python process that imports Tandem's core as `tandem run` does
(`bot.run.app`) and litellm (as the first turn does), builds the tool context as `ToolEnv` does (the
environment scrubbed by `clean_env`, the redactor of `redact.known`, the default output
limit of 16,000 characters and the default timeout) and runs one small command to warm
up. Then it reads its peak RSS (`ru_maxrss`), runs the real `shell` tool on a command that
prints `--mb` MB of short lines (`yes ... | head -c`) and turns the result into what the
model gets as the runner does (`outcome_of`: redacted, then capped), and reads its peak
RSS again. Printed: the peak before and after, the rise, and the call's wall time; the
median of `--runs`. `--tree` runs another checkout's `bot` (e.g. a worktree of the commit
before this change) with the same script.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
MIB = 1024 * 1024


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def child(size: int, with_litellm: bool) -> dict[str, Any]:
    if with_litellm:
        import litellm  # noqa: F401  (loaded by the first turn: Tandem's RSS is ~200 MiB then)
    import bot.run.app  # noqa: F401  (Tandem's core, as `tandem run` imports it)
    from bot.core import redact
    from bot.core.config import Limits
    from bot.tools import ToolContext, outcome_of
    from bot.tools.shell import TOOLS, clean_env

    tool = TOOLS[0]
    limits = Limits()
    redactor = redact.known([])
    extra = {"redactor": redactor} if "redactor" in ToolContext.__dataclass_fields__ else {}
    with tempfile.TemporaryDirectory() as tmp:
        ctx = ToolContext(workspace=Path(tmp), protected=frozenset(),
                          env=clean_env(dict(os.environ), []),
                          shell_timeout_s=limits.shell_timeout_s,
                          output_chars=limits.tool_output_chars, **extra)

        async def call(command: str) -> tuple[str, float]:
            started = time.perf_counter()
            task = asyncio.ensure_future(tool.run(ctx, {"command": command}))
            await asyncio.gather(task, return_exceptions=True)
            _, text = outcome_of(task, tool.name, limits.tool_output_chars, redactor)
            return text, time.perf_counter() - started

        await call("echo warm")
        before = peak_mib()
        text, took = await call(f"yes 'a line that a command prints' 2>/dev/null "
                                f"| head -c {size}")
        after = peak_mib()
    return {"before_mib": before, "after_mib": after, "rise_mib": after - before,
            "seconds": took, "result_chars": len(text)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tree", default=str(REPO))
    parser.add_argument("--no-litellm", action="store_true",
                        help="leave litellm out: a lower peak before, so a rise shows sooner")
    parser.add_argument("--json")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    size = args.mb * 1_000_000
    if args.child:
        sys.path.insert(0, args.tree)
        print(json.dumps(asyncio.run(child(size, not args.no_litellm))))
        return
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    runs = []
    for _ in range(args.runs):
        done = subprocess.run([sys.executable, __file__, "--child", "--mb", str(args.mb),
                               "--tree", args.tree, *(["--no-litellm"] * args.no_litellm)],
                              env=env, cwd=args.tree,
                              capture_output=True, text=True, check=True)
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    median = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
    print(f"shell call printing {args.mb} MB ({args.tree}), median of {args.runs} runs:")
    print(f"  peak RSS before {median['before_mib']:.0f} MiB, after {median['after_mib']:.0f} "
          f"MiB (+{median['rise_mib']:.1f} MiB)")
    print(f"  time {median['seconds']:.2f} s; the model gets {median['result_chars']:.0f} "
          "characters")
    for run in runs:
        print(f"  run: {run['before_mib']:.0f} -> {run['after_mib']:.0f} MiB, "
              f"{run['seconds']:.2f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"median": median, "runs": runs}))


if __name__ == "__main__":
    main()
