"""JSON schemas that are slow to compile into grammars: objects nested ``depth`` deep."""

from __future__ import annotations

import json
from typing import Any


def nested_schema(depth: int, tag: str) -> dict[str, Any]:
    """Objects nested ``depth`` deep, each with one required property named after ``tag`` (a
    fresh ``tag`` is a fresh grammar: no cache holds it). xgrammar's compile time grows
    steeply with the depth: seconds at 300 on two cores."""
    schema: dict[str, Any] = {"type": "string"}
    for level in range(depth):
        name = f"{tag}_{level}"
        schema = {"type": "object", "properties": {name: schema}, "required": [name]}
    return schema


def nested_schema_text(depth: int, tag: str) -> str:
    """``nested_schema`` as JSON text."""
    return json.dumps(nested_schema(depth, tag))
