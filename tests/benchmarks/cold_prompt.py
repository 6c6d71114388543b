"""What templating and tokenizing a prompt costs warm, and cold: after the process sat idle.

A first token's path runs once per request, and between requests of a quiet gateway the core
idles and its caches go to other work, so each of its steps runs cold. This prints the
gateway's prompt step (``PromptTokenizer``, the tiny model's tokenizer, the capacity
benchmark's prompt) in a tight loop and after each of a hundred pauses, beside a loop of plain
Python for the core's own speed. ``python -m tests.benchmarks.cold_prompt``.
"""

from __future__ import annotations

import argparse
import statistics
import time
import timeit
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from deploy.sidecar.models import ensure_tiny_model
from gateway.catalog.text.prompts import PromptTokenizer
from tests.benchmarks.capacity_setup import PROMPT


def warm_us(work: Callable[[], object], number: int) -> float:
    """Microseconds a call, back to back."""
    work()
    return timeit.timeit(work, number=number) / number * 1e6


def cold_us(work: Callable[[], object], pause_s: float, calls: int = 100) -> float:
    """Median microseconds a call, each after ``pause_s`` idle."""
    times = []
    for _ in range(calls):
        time.sleep(pause_s)
        started = time.perf_counter()
        work()
        times.append((time.perf_counter() - started) * 1e6)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pause", type=float, default=0.05, help="idle seconds before a call")
    args = parser.parse_args()
    prompts = PromptTokenizer.load(str(ensure_tiny_model()), ThreadPoolExecutor(1))
    messages = [{"role": "user", "content": PROMPT}]
    cases: dict[str, tuple[Callable[[], object], int]] = {
        "plain Python (sum of 10,000 ints)": (lambda: sum(range(10_000)), 2000),
        "completion prompt (tokenize)": (lambda: prompts._text_prompt(PROMPT), 5000),
        "chat prompt (template, tokenize)": (lambda: prompts._chat_prompt(messages), 2000),
    }
    print(f"| step | warm µs | after {args.pause * 1000:.0f} ms idle µs |")
    print("|---|---:|---:|")
    for name, (work, number) in cases.items():
        print(f"| {name} | {warm_us(work, number):.1f} | {cold_us(work, args.pause):.1f} |")


if __name__ == "__main__":
    main()
