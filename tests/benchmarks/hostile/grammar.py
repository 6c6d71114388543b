"""A tenant's latency while another sends JSON schemas, each a fresh grammar to compile.

Two attacks, each schema with fresh property names (no cache holds it), from two clients of
one attacker tenant, against the runner's starter setup:

- ``response_format`` json_schema objects nested ``--depth`` (300) deep: past the gateway's
  ``max_guide_depth``, refused before the engine sees them;
- the costliest schema still within the gateway's bounds (``RequestBounds``' default
  ``max_guide_bytes`` and ``max_guide_depth``): string properties with a bounded-repeat
  ``pattern``, as many as fit in the bytes (992). xgrammar 0.2.8 on SmolLM2's tokenizer, one
  thread, no cache, compiles 10 such properties in 1.5 s, 40 in 6.6 s, 120 in 23 s (the 992,
  at that rate, in minutes), where the deepest nesting allowed (31 objects, 63 levels) takes
  0.06 s, 300 levels 5.5 s, 64 KiB of plain string properties 0.25 s, a 64 KiB ``enum`` 0.08 s
  and ``{1,300}`` in place of ``{1,90}`` 0.14 s for 10. So here the engine's compile pool
  (``guided_decoding_max_compiles`` threads at a lower priority, a late 400 after
  ``guided_decoding_compile_timeout_ms``) is what protects the victim.

    python -m tests.benchmarks.hostile.grammar [--seconds 15] [--depth 300]

Prints the runner's table; nothing is asserted.
"""

from __future__ import annotations

import argparse
import itertools
import json
from typing import Any

from gateway.ops.starter import MODEL
from gateway.settings import RequestBounds
from tests.benchmarks.hostile.runner import (
    Attack,
    attacker_key,
    post_attack,
    run_attacks,
    starter,
    table,
)
from tests.support.schemas import nested_schema

ASK = [{"role": "user", "content": "Say hello."}]
ATTACK_TOKENS = 33
CLIENTS = 2
"""Clients of the attacker tenant sending at once."""
COSTLY_PATTERN = "^[a-z]{1,90}$"
"""A bounded repeat: xgrammar expands it into 90 optional steps, each checked against the whole
vocabulary."""


def patterned_schema(tag: str, max_bytes: int) -> dict[str, Any]:
    """An object of required string properties named after ``tag``, each with
    ``COSTLY_PATTERN``, as many as ``max_bytes`` of JSON hold."""

    def of(count: int) -> dict[str, Any]:
        names = [f"{tag}_{n}" for n in range(count)]
        properties = {name: {"type": "string", "pattern": COSTLY_PATTERN} for name in names}
        return {"type": "object", "properties": properties, "required": names}

    # The response_format around the schema takes some bytes too.
    budget = max_bytes - 200
    count = budget // len(json.dumps(of(1)))
    while len(json.dumps(of(count + 1))) <= budget:
        count += 1
    return of(count)


def guide_attack(url: str, key: str, schema_of: Any) -> list[Attack]:
    """``CLIENTS`` clients sending chats whose ``response_format`` is ``schema_of(tag)``,
    a fresh ``tag`` each time."""
    tags = itertools.count()

    def body() -> bytes:
        schema = schema_of(f"p{next(tags)}")
        response_format = {"type": "json_schema", "json_schema": {"name": "g", "schema": schema}}
        return json.dumps(
            {
                "model": MODEL,
                "messages": ASK,
                "max_tokens": ATTACK_TOKENS,
                "response_format": response_format,
            }
        ).encode()

    return [post_attack(url, key, "/v1/chat/completions", body) for _ in range(CLIENTS)]


def attacks(url: str, first_tenant: int, depth: int = 300) -> list[tuple[str, list[Attack]]]:
    """The two schema attacks, sent by tenant ``first_tenant`` and the one after it."""
    bounds = RequestBounds()
    costly = patterned_schema("p", bounds.max_guide_bytes)
    return [
        (
            f"json_schema nested {depth} deep, fresh names",
            guide_attack(url, attacker_key(first_tenant), lambda t: nested_schema(depth, t)),
        ),
        (
            f"json_schema of {len(costly['properties'])} patterned properties "
            f"({len(json.dumps(costly)) // 1024} KiB), fresh names",
            guide_attack(
                url,
                attacker_key(first_tenant + 1),
                lambda t: patterned_schema(t, bounds.max_guide_bytes),
            ),
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--depth", type=int, default=300)
    args = parser.parse_args()
    with starter(2) as served:
        rows = run_attacks(served, args.seconds, attacks(served.url, 0, args.depth))
    print(table(rows))


if __name__ == "__main__":
    main()
