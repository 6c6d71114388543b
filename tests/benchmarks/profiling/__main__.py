"""The profiles of ``capacity --profile DIR`` summed up per gateway (all its workers): the time
spent in each module and built-in, those of the gateways side by side (a Markdown table), then
each gateway's costliest functions. ``python -m tests.benchmarks.profiling DIR``."""

from __future__ import annotations

import argparse
import collections
import io
import pstats
from pathlib import Path


def by_module(stats: pstats.Stats) -> collections.Counter[str]:
    """Time spent in each module's own code (each built-in apart)."""
    totals: collections.Counter[str] = collections.Counter()
    for (file, _, function), (_, _, own, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        key = function if file.startswith("~") else file.split("/site-packages/")[-1]
        totals[key.removeprefix(str(Path.cwd()) + "/")] += own
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--top", type=int, default=30, help="rows of the table")
    args = parser.parse_args()
    gateways: dict[str, pstats.Stats] = {}
    for name in sorted({path.name.split(".")[0] for path in args.folder.glob("*.prof")}):
        files = [str(path) for path in args.folder.glob(f"{name}.*.prof")]
        gateways[name] = pstats.Stats(*files, stream=io.StringIO())
    modules = {name: by_module(stats) for name, stats in gateways.items()}
    rows = collections.Counter(
        {key: max(totals[key] for totals in modules.values())
         for totals in modules.values() for key in totals}
    )  # fmt: skip
    # The frame that runs the event loop holds its waits for I/O: more than half of the time,
    # and not the gateway's work.
    ((waiting, most),) = rows.most_common(1)
    if most > 0.5 * max(sum(totals.values()) for totals in modules.values()):
        del rows[waiting]
        print(f"Left out: `{waiting}`, where the event loop runs (its waits included).\n")
    print("| module or built-in | " + " | ".join(f"{name}, s" for name in modules) + " |")
    print("|---|" + "---:|" * len(modules))
    for key, _ in rows.most_common(args.top):
        print(f"| `{key}` | " + " | ".join(f"{totals[key]:.2f}" for totals in modules.values())
              + " |")  # fmt: skip
    for name, stats in gateways.items():
        out = io.StringIO()
        stats.stream = out  # type: ignore[attr-defined]
        stats.sort_stats("tottime").print_stats(args.top)
        print(f"\n## {name}\n\n```\n{out.getvalue().strip()}\n```")


if __name__ == "__main__":
    main()
