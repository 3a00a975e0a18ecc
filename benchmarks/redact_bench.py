"""What the redaction pass costs on a 16 kB tool output.

    python benchmarks/redact_bench.py [--secrets 8] [--json out.json]

Four outputs of 16,000 characters: shell-like text with no secret, the same with three
secrets in it (a configured one, an `sk-` key, a Telegram token), random base64 (the
worst case for the shape probes), and text with emoji whose variation selectors make
the pass look through invisible characters too. The redactor knows `--secrets` configured values of
mixed shapes, as a real configuration with a few MCP credentials would.
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bot.core.redact import Redactor

SIZE = 16_000


def outputs(rng: random.Random) -> dict[str, str]:
    words = ["total", "drwxr-xr-x", "root", "4096", "2026-12-01", "12:30", "notes.txt",
             "PATH=/usr/local/bin:/usr/bin", "HOME=/root", "ok", "\n", "-rw-r--r--"]
    plain = " ".join(rng.choice(words) for _ in range(4000))[:SIZE]
    third = SIZE // 3
    leaked = (plain[:third] + " hunter2-signing-secret-0 " + plain[third:2 * third]
              + " sk-proj-AbCdEf0123456789xyz 123456789:AAFakeTelegramTokenValue1234567890ab "
              + plain[2 * third:])[:SIZE]
    noise = base64.b64encode(rng.randbytes(SIZE)).decode()[:SIZE]
    # text with emoji and their variation selectors: the pass that sees through invisible
    # characters runs (a secret strewn with them, or spelled by a run of them, is found)
    emoji = " ".join(rng.choice([*words, "❤️", "👍🏽", "Grüße", "完成"]) for _ in range(4000))[:SIZE]
    return {"clean shell output": plain, "three secrets inside": leaked, "base64": noise,
            "emoji, variation sel.": emoji}


def measure(redactor: Redactor, text: str, rounds: int) -> list[float]:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        redactor.redact(text)
        times.append((time.perf_counter() - start) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--secrets", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--json")
    args = parser.parse_args()
    secrets = [f"hunter2-signing-secret-{i}" if i % 2 else f"{i:032x}"
               for i in range(args.secrets)]
    redactor = Redactor(secrets)
    results = {}
    print(f"redaction of a {SIZE:,}-character output, {args.secrets} configured secrets")
    for name, text in outputs(random.Random(7)).items():
        times = measure(redactor, text, args.rounds)
        p50, p99 = statistics.median(times), sorted(times)[int(len(times) * 0.99)]
        results[name] = {"p50_ms": round(p50, 4), "p99_ms": round(p99, 4)}
        print(f"  {name:22} p50 {p50:.3f} ms   p99 {p99:.3f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps(results))


if __name__ == "__main__":
    main()
