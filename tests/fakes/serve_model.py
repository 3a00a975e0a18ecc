"""Run the test suite's fake model as a server, to try Tandem without an LLM key.

    python -m tests.fakes.serve_model --port 8001
    TANDEM_LLM__MODEL=openai/fake TANDEM_LLM__API_BASE=http://127.0.0.1:8001/v1 \\
    TANDEM_LLM__API_KEY=none TANDEM_LLM__CONTEXT_WINDOW=32000 tandem chat

It answers "run <command>" with a `shell` call, "read <path>" with `read_file`, reports
tool results, and echoes anything else.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from tests.fakes.model_server import FakeModelServer, Reply, ToolCallSpec


def respond(messages: list[dict[str, Any]]) -> Reply:
    if len(messages) > 1 and str(messages[-1].get("content")).startswith("[Current state"):
        messages = messages[:-1]  # Tandem's state note comes last
    last = messages[-1]
    if last["role"] == "tool":
        return Reply(text=f"The tool answered:\n\n```\n{last['content'][:1500]}\n```")
    text = str(last.get("content") or "")
    words = text.split("] ", 1)[-1]
    if words.startswith("run "):
        return Reply(tool_calls=[ToolCallSpec("shell", {"command": words[4:]})])
    if words.startswith("read "):
        return Reply(tool_calls=[ToolCallSpec("read_file", {"path": words[5:]})])
    return Reply(text=f"You said: {words}")


async def main(port: int) -> None:
    server = FakeModelServer(port=port)
    server.responder = respond
    await server.start()
    print(f"fake model at {server.api_base}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await server.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=8001)
    try:
        asyncio.run(main(parser.parse_args().port))
    except KeyboardInterrupt:
        pass
