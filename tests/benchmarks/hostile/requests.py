"""A hostile tenant's oversize requests against the starter's setup: what they cost the others.

Starts ``triton-gateway serve`` on the starter's settings (``triton-gateway init``: SmolLM2,
its tenants and limits (``runner``: each attack is a tenant with team-b's limits), then measures the
victim tenant's chat quiet, and while the attacker sends one oversize request after another, as
fast as they are answered, for ``--seconds``:

- ``/v1/completions`` with 200,000 one-character prompts;
- ``/v1/completions`` with 2,000 prompts and ``max_tokens: 1``;
- chats with 120,000 distinct ``stop`` strings.

Prints the runner's table: the victim's p50 beside each attack, the attacker's answers, the first
429, the time to the refusal and the gateway's RSS:

    python -m tests.benchmarks.hostile.requests [--seconds 15]
"""

from __future__ import annotations

import argparse
import functools
import json
from typing import Any

from gateway.ops.starter import MODEL
from tests.benchmarks.hostile.runner import (
    Attack,
    attacker_key,
    post_attack,
    run_attacks,
    starter,
    table,
)

ATTACKS: dict[str, tuple[str, dict[str, Any]]] = {
    "200,000 one-character prompts": (
        "/v1/completions",
        {"prompt": ["a"] * 200_000, "max_tokens": 1},
    ),
    "2,000 prompts, max_tokens 1": (
        "/v1/completions",
        {"prompt": [f"Tell me about {i}" for i in range(2000)], "max_tokens": 1},
    ),
    "120,000 distinct stop strings": (
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 4,
            "stop": [f"stop-{i}" for i in range(120_000)],
        },
    ),
}


def attacks(url: str, first_tenant: int) -> list[tuple[str, list[Attack]]]:
    """Each oversize request, sent by tenant ``first_tenant`` and the ones after it."""
    out = []
    for offset, (name, (path, body)) in enumerate(ATTACKS.items()):
        encoded = json.dumps({"model": MODEL, **body}).encode()
        key = attacker_key(first_tenant + offset)
        out.append((name, [post_attack(url, key, path, functools.partial(bytes, encoded))]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    args = parser.parse_args()
    with starter(len(ATTACKS)) as served:
        rows = run_attacks(served, args.seconds, attacks(served.url, 0))
    print(table(rows))


if __name__ == "__main__":
    main()
