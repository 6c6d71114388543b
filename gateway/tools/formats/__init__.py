"""Tool-call formats of model families, one module each, chosen per model by name or from its
chat template."""

from __future__ import annotations

from collections.abc import Callable

from gateway.tools.formats.base import Function, ToolFormat, json_arguments
from gateway.tools.formats.deepseek_v3 import DeepSeekV3
from gateway.tools.formats.glm45 import Glm45
from gateway.tools.formats.harmony import HarmonyCalls
from gateway.tools.formats.hermes import Hermes
from gateway.tools.formats.kimi_k2 import KimiK2
from gateway.tools.formats.llama3_json import Llama3Json
from gateway.tools.formats.mistral import Mistral
from gateway.tools.formats.pythonic import Pythonic
from gateway.tools.formats.qwen3_coder import Qwen3Coder

FORMATS: dict[str, Callable[[], ToolFormat]] = {
    "hermes": Hermes,
    "llama3_json": Llama3Json,
    "mistral": Mistral,
    "pythonic": Pythonic,
    "qwen3_coder": Qwen3Coder,
    "glm45": Glm45,
    "deepseek_v3": DeepSeekV3,
    "kimi_k2": KimiK2,
    "harmony": HarmonyCalls,
}

_SIGNS = (
    ("<|channel|>", "harmony"),
    ("<|tool_calls_section_begin|>", "kimi_k2"),
    ("<｜tool▁calls▁begin｜>", "deepseek_v3"),
    ("<arg_key>", "glm45"),
    ("<function=", "qwen3_coder"),
    ("[TOOL_CALLS]", "mistral"),
    ("<|python_tag|>", "llama3_json"),
    ("ipython", "llama3_json"),
    ("<tool_call>", "hermes"),
)
"""Text only one family's template writes, most specific first."""


def tool_format(name: str) -> ToolFormat:
    """The format called ``name`` (one of ``FORMATS``)."""
    return FORMATS[name]()


def guess_format(template: str | None) -> str:
    """The format a chat template's own tool-call text suggests; ``hermes`` otherwise."""
    text = template or ""
    return next((name for sign, name in _SIGNS if sign in text), "hermes")


__all__ = ["FORMATS", "Function", "ToolFormat", "guess_format", "json_arguments", "tool_format"]
