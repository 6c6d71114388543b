"""How a served model's generated text is decoded: which special tokens it keeps, decided from
its settings and the special tokens its tool-call and reasoning formats read."""

from __future__ import annotations

from gateway.catalog.text.prompts import PromptTokenizer
from gateway.settings import SettingsError
from gateway.tools import model_formats, special_tokens_read


def decoding(
    tokenizer: PromptTokenizer,
    model: str,
    skip_special_tokens: bool | None,
    format_name: str | None,
    reasoning_name: str | None,
    *,
    postprocessing: str | None = None,
) -> PromptTokenizer:
    """``tokenizer`` decoding as model ``model``'s formats need: keeping the special tokens they
    read and no other where ``skip_special_tokens`` is unset; set true, it may not drop markers
    the formats read (a ``SettingsError`` naming both), nor may the postprocessing of pipeline
    ``postprocessing``, where that decodes the model's text instead of the gateway."""
    template = tokenizer.template_text
    needed = tokenizer.special_among(special_tokens_read(format_name, reasoning_name, template))
    if not needed:
        return tokenizer
    if skip_special_tokens is None and postprocessing is None:
        return tokenizer.keeping(needed)
    if skip_special_tokens is False:
        return tokenizer
    fmt, reasoning = model_formats(format_name, reasoning_name, template)
    formats = [f"tool_call_format {fmt.name!r}"]
    if reasoning is not None:
        formats.append(f"reasoning_parser {reasoning.name!r}")
    read = f"its {' and '.join(formats)} read the special tokens {', '.join(needed)}"
    if skip_special_tokens:
        raise SettingsError(
            f"model {model!r}: skip_special_tokens is true, and {read}, which decoding would "
            "drop: leave skip_special_tokens unset (special tokens but those are left out) or "
            "set it false"
        )
    raise SettingsError(
        f"model {model!r}: {read}, which the postprocessing of pipeline {postprocessing!r} "
        "drops: set the pipeline's skip_special_tokens false, or serve the model with entry "
        "tensorrt_llm (the gateway then decodes, keeping those alone)"
    )
