"""Guided decoding with xgrammar, on TensorRT-LLM's contract: guide types, compilation, masks.

The ``tensorrt_llm`` inputs ``guided_decoding_guide_type`` and ``guided_decoding_guide`` name a
grammar; each sequence of a guided request gets its own matcher, whose bitmask limits the next
token inside the shared decode batch. Grammars compile beside the engine and are cached by
content there (``grammars.GrammarCompiles``), not in xgrammar's unbounded cache.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from deploy.triton.engine.types import (
    EngineError,
    GuidedConfig,
    GuideRequest,
    TokenIds,
)

NOT_ENABLED = (
    "Guided decoding is not enabled for this model: set the tensorrt_llm parameter "
    "guided_decoding_backend to xgrammar"
)
_XGRAMMAR_PREFIX = re.compile(r"^\[[\d:]+\]\s+\S+:\d+:\s*(Check failed: \(.*?\) is false:\s*)?")


def _clean(error: Exception) -> str:
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return _XGRAMMAR_PREFIX.sub("", text)


def _legacy_structural_tag(tag: dict[str, Any]) -> dict[str, Any]:
    """OpenAI-style ``{"structures": [{begin, schema, end}], "triggers": [...]}`` (as vLLM and
    TensorRT-LLM's LLM API send it) in xgrammar's structural-tag format."""
    tags = [
        {
            "begin": item["begin"],
            "content": {"type": "json_schema", "json_schema": item.get("schema", True)},
            "end": item["end"],
        }
        for item in tag["structures"]
    ]
    return {
        "type": "structural_tag",
        "format": {"type": "triggered_tags", "triggers": tag["triggers"], "tags": tags},
    }


class GuidedDecoding:
    """Compiles guides for one model's vocabulary and makes per-sequence matchers."""

    def __init__(self, tokenizer_info: Any) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        self.vocab_size = int(tokenizer_info.vocab_size)
        self.stop_ids: TokenIds = tuple(int(t) for t in tokenizer_info.stop_token_ids)
        self._compiler = xgr.GrammarCompiler(tokenizer_info, max_threads=2, cache_enabled=False)

    @classmethod
    def load(
        cls, config: GuidedConfig, model_path: str, vocab_size: int, stop_ids: TokenIds
    ) -> GuidedDecoding:
        """From the tokenizer info file when given, else from the Hugging Face tokenizer."""
        import xgrammar as xgr

        if config.tokenizer_info_path:
            info = json.loads(Path(config.tokenizer_info_path).read_text())
            metadata = xgr.TokenizerInfo._detect_metadata_from_hf(info["tokenizer_str"])
            tokenizer_info = xgr.TokenizerInfo(
                info["encoded_vocab"],
                metadata["vocab_type"],
                vocab_size=vocab_size,
                stop_token_ids=info.get("stop_token_ids") or list(stop_ids) or None,
                add_prefix_space=bool(metadata["add_prefix_space"]),
            )
        else:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(config.tokenizer_dir or model_path)
            tokenizer_info = xgr.TokenizerInfo.from_huggingface(
                tokenizer, vocab_size=vocab_size, stop_token_ids=list(stop_ids) or None
            )
        return cls(tokenizer_info)

    def compile(self, request: GuideRequest) -> Any:
        """The compiled grammar of a guide; a bad guide is an ``EngineError`` naming why."""
        compiler, kind, guide = self._compiler, request.guide_type, request.guide or ""
        try:
            if kind == "json":
                return compiler.compile_builtin_json_grammar()
            if kind == "json_schema":
                return compiler.compile_json_schema(guide)
            if kind == "regex":
                return compiler.compile_regex(guide)
            if kind == "ebnf_grammar":
                return compiler.compile_grammar(guide)
            tag = json.loads(guide)
            if isinstance(tag, dict) and "structures" in tag and "triggers" in tag:
                tag = _legacy_structural_tag(tag)
            return compiler.compile_structural_tag(json.dumps(tag))
        except Exception as exc:  # xgrammar raises RuntimeError and its own error types
            raise EngineError(
                f"invalid guided_decoding_guide for guide type {kind}: {_clean(exc)}"
            ) from exc

    def matcher(self, compiled: Any, end_ids: TokenIds) -> GrammarState:
        """A fresh matcher for one sequence; the sequence's end ids end the grammar."""
        stops = list(end_ids) or list(self.stop_ids)
        matcher = self._xgr.GrammarMatcher(compiled, override_stop_tokens=stops or None)
        return GrammarState(matcher, frozenset(stops))


class GrammarState:
    """The grammar of one sequence: what it allows next, and the tokens it accepted."""

    def __init__(self, matcher: Any, stops: frozenset[int]) -> None:
        self.matcher = matcher
        self.stops = stops

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed-next-token bits into row ``row`` of ``bitmask``."""
        self.matcher.fill_next_token_bitmask(bitmask, row)

    def accept(self, token: int) -> bool:
        """Advance past ``token``; False when the grammar rejects it."""
        return bool(self.matcher.accept_token(token))


def allowed_tokens(bitmask: torch.Tensor, vocab_size: int, device: torch.device) -> torch.Tensor:
    """xgrammar's packed int32 bitmask ``[rows, ceil(vocab/32)]`` as booleans ``[rows, vocab]``."""
    bits = torch.arange(32, dtype=torch.int32)
    unpacked = (bitmask.unsqueeze(-1) >> bits) & 1
    return unpacked.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool().to(device)


def grammar_masks(
    states: Sequence[GrammarState | None], vocab_size: int, device: torch.device
) -> tuple[list[int], torch.Tensor] | None:
    """Rows with a grammar and their allowed tokens, or None when no row is guided."""
    rows = [row for row, state in enumerate(states) if state is not None]
    if not rows:
        return None
    words = (vocab_size + 31) // 32
    bitmask = torch.full((len(rows), words), -1, dtype=torch.int32)
    for index, row in enumerate(rows):
        state = states[row]
        assert state is not None
        state.fill(bitmask, index)
    return rows, allowed_tokens(bitmask, vocab_size, device)


def write_tokenizer_info(model_dir: str, out_file: Path) -> Path:
    """TensorRT-LLM's ``xgrammar_tokenizer_info.json`` for a Hugging Face tokenizer, as
    ``generate_xgrammar_tokenizer_info.py`` writes it (for ``xgrammar_tokenizer_info_path``)."""
    import xgrammar as xgr
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    vocab = tokenizer.get_vocab()
    encoded = [""] * len(vocab)
    for token, index in vocab.items():
        if index < len(encoded):
            encoded[index] = token
    info = xgr.TokenizerInfo.from_huggingface(tokenizer)
    document = {
        "encoded_vocab": encoded,
        "tokenizer_str": tokenizer.backend_tokenizer.to_str(),
        "stop_token_ids": list(info.stop_token_ids),
    }
    out_file.parent.mkdir(parents=True, exist_ok=True)
    out_file.write_text(json.dumps(document))
    return out_file
