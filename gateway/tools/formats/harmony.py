"""gpt-oss's calls: harmony ``commentary`` messages addressed ``to=functions.NAME``, read with
the other channels (``gateway.tools.reasoning.harmony``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.tools.formats.base import Function, ToolFormat, call_arguments, dumps
from gateway.tools.parsing import ContentParser, Parser
from gateway.tools.reasoning.harmony import SPECIAL_TOKENS, HarmonySplit


class HarmonyCalls(ToolFormat):
    """gpt-oss (its template renders the tools itself)."""

    name = "harmony"
    reads_reasoning = True
    special_tokens = SPECIAL_TOKENS

    def howto(self) -> str:
        return (
            "To call a function, write <|start|>assistant<|channel|>commentary "
            "to=functions.FUNCTION-NAME <|constrain|>json<|message|>ARGUMENTS-JSON<|call|>"
        )

    def render_calls(self, calls: Sequence[dict[str, Any]]) -> str:
        texts = []
        for call in calls:
            name, arguments = call_arguments(call)
            texts.append(
                f"<|start|>assistant<|channel|>commentary to=functions.{name} "
                f"<|constrain|>json<|message|>{dumps(arguments)}<|call|>"
            )
        return "".join(texts)

    def parser(self, functions: Sequence[Function] = ()) -> Parser:
        return HarmonySplit(ContentParser())
