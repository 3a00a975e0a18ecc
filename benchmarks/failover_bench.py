"""What a hung model costs each turn, with a working fallback: the wait per model call.

    python benchmarks/failover_bench.py [--calls 8] [--timeout 1.0] [--retries 2]
                                        [--tree PATH] [--json out.json]

One fake OpenAI-compatible endpoint (`tests.fakes.failing_model`) on which the main model
(`openai/fake`) hangs and the fallback (`openai/backup`) answers at once. The real litellm
client (`bot.llm.LiteLLMClient`) makes `--calls` model calls in a row, as consecutive turns
of one or several conversations do, with `llm.timeout_s = --timeout` and `llm.retries =
--retries`; printed: how long each call took and which model answered. `--tree` runs
another checkout's `bot` (e.g. a worktree of the commit before this change) with the same
script: its fallbacks are names (it reached a fallback of the main model's provider at the
main model's endpoint), this tree's a full entry at the same endpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


async def measure(calls: int, timeout: float, retries: int) -> list[dict[str, Any]]:
    from bot import llm
    from bot.core.config import LLMConfig
    from tests.fakes.failing_model import FailingModel
    from tests.fakes.model_server import Reply

    async with FailingModel() as server:
        server.down, server.only = "hang", "fake"
        server.responder = lambda messages: Reply(text="from the backup")
        try:  # this tree: a full entry; an older tree takes names only
            fallbacks: list[Any] = [{"model": "openai/backup", "api_base": server.api_base,
                                     "api_key": "sk-bench"}]
            config = LLMConfig.model_validate({
                "model": "openai/fake", "api_base": server.api_base, "api_key": "sk-bench",
                "timeout_s": timeout, "retries": retries, "fallbacks": fallbacks})
        except ValueError:
            config = LLMConfig(model="openai/fake", api_base=server.api_base,
                               api_key="sk-bench", timeout_s=timeout, retries=retries,
                               fallbacks=["openai/backup"])
        client = llm.LiteLLMClient(config)
        await llm.load()  # the import is not what is measured
        out = []
        for _ in range(calls):
            started = time.perf_counter()
            items = [i async for i in client.stream([{"role": "user", "content": "hi"}], [])]
            took = time.perf_counter() - started
            last = items[-1]
            assert isinstance(last, llm.Completion), last
            out.append({"seconds": round(took, 3), "model": last.model})
        await llm.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=1.0)
    parser.add_argument("--retries", type=int, default=2)
    parser.add_argument("--tree", default=str(REPO))
    parser.add_argument("--json")
    parser.add_argument("--child", action="store_true")
    args = parser.parse_args()
    if args.child:
        sys.path.insert(0, str(REPO))
        import tests.fakes.failing_model  # noqa: F401 - the fakes come from this tree...
        sys.path.insert(0, args.tree)  # ...and `bot` from the one measured
        found = asyncio.run(measure(args.calls, args.timeout, args.retries))
        print(json.dumps(found))
        return
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    done = subprocess.run([sys.executable, __file__, "--child", "--calls", str(args.calls),
                           "--timeout", str(args.timeout), "--retries", str(args.retries),
                           "--tree", args.tree], env=env, cwd=args.tree, check=True,
                          capture_output=True, text=True)
    calls = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"{args.calls} model calls in a row, the main model hung, llm.timeout_s = "
          f"{args.timeout:g}, llm.retries = {args.retries} ({args.tree}):")
    for n, call in enumerate(calls, 1):
        print(f"  call {n}: {call['seconds']:7.3f} s  answered by {call['model']}")
    total = sum(c["seconds"] for c in calls)
    print(f"  total: {total:.2f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"calls": calls, "total_s": round(total, 3)}))


if __name__ == "__main__":
    main()
