"""A Hugging Face tokenizer folder read without ``transformers``: ``tokenizer.json`` and its config.

The gateway and the pipeline's preprocessing and postprocessing models keep to the Rust
``tokenizers`` library, jinja2 and JSON: importing ``transformers`` loads torch wherever it is
installed, several hundred megabytes and seconds of start-up for what a tokenizer needs. A
folder without ``tokenizer.json`` (a slow, SentencePiece-only tokenizer) falls back to
``transformers``.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from tokenizers import Tokenizer

from deploy.triton.pipeline.detokenizer import IncrementalText, WindowedText

try:
    from tokenizers.decoders import DecodeStream
except ImportError:  # tokenizers < 0.21, as older Triton containers have for the pipeline models
    DecodeStream = None

logger = logging.getLogger(__name__)
SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
)


class TextTokenizer(Protocol):
    """What the gateway and the pipeline models need of a model's tokenizer."""

    special_tokens: Mapping[str, str]
    """Named special tokens (``bos_token``, ``eos_token``...) as text, for chat templates."""
    chat_template: str | dict[str, str] | None
    model_max_length: int | None

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        """Token ids of ``text``, with the tokenizer's special tokens when asked."""
        ...

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool) -> str:
        """Text of ``ids``, without clean-up of spaces (as the pipeline's postprocessing)."""
        ...

    def token_id(self, token: str | None) -> int | None:
        """The id of a special token's text, if the vocabulary has it."""
        ...

    def text_stream(self, *, skip_special_tokens: bool) -> IncrementalText:
        """A fresh incremental decoder for one generated sequence: its deltas concatenate to
        ``decode`` of all its ids."""
        ...

    def __len__(self) -> int: ...


class HubTokenizer:
    """``tokenizer.json`` through the Rust library, with the special tokens and chat template of
    ``tokenizer_config.json`` (and ``special_tokens_map.json``, ``chat_template.jinja``)."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        config: Mapping[str, Any],
        *,
        chat_template: str | dict[str, str] | None = None,
    ) -> None:
        # As transformers encodes: whole texts, unpadded, whatever tokenizer.json sets.
        tokenizer.no_truncation()
        tokenizer.no_padding()
        self._tokenizer = tokenizer
        self.special_tokens: Mapping[str, str] = {
            name: text for name in SPECIAL_TOKEN_NAMES if (text := _token_text(config.get(name)))
        }
        self.chat_template = chat_template
        length = config.get("model_max_length")
        self.model_max_length = int(length) if isinstance(length, int | float) else None
        self._size = tokenizer.get_vocab_size(with_added_tokens=True)

    @classmethod
    def from_dir(cls, folder: Path) -> HubTokenizer:
        """Read a tokenizer folder (blocking)."""
        config = _json(folder / "tokenizer_config.json")
        special = _json(folder / "special_tokens_map.json")
        merged = {**special, **{k: v for k, v in config.items() if v is not None}}
        return cls(
            Tokenizer.from_file(str(folder / "tokenizer.json")),
            merged,
            chat_template=_chat_template(folder, config),
        )

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        """Token ids of ``text``."""
        ids: list[int] = self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids
        return ids

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool) -> str:
        """Text of ``ids``."""
        return str(self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def text_stream(self, *, skip_special_tokens: bool) -> IncrementalText:
        """A fresh incremental decoder for one generated sequence, in the Rust library (a window
        at a time where the library has no incremental decoder)."""
        if DecodeStream is None:
            return WindowedText(
                functools.partial(self.decode, skip_special_tokens=skip_special_tokens)
            )
        return StreamedText(self._tokenizer, skip_special_tokens=skip_special_tokens)

    def token_id(self, token: str | None) -> int | None:
        """The id of ``token``'s text."""
        if not token:
            return None
        found = self._tokenizer.token_to_id(token)
        return None if found is None else int(found)

    def __len__(self) -> int:
        return int(self._size)


class TransformersTokenizer:
    """A tokenizer only ``transformers`` can load (no ``tokenizer.json``), behind the same face."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        # Its encode sets truncation on the Rust tokenizer: no other call may run meanwhile.
        self._lock = threading.Lock()
        self.special_tokens: Mapping[str, str] = dict(tokenizer.special_tokens_map)
        self.chat_template = getattr(tokenizer, "chat_template", None)
        length = getattr(tokenizer, "model_max_length", None)
        self.model_max_length = int(length) if isinstance(length, int) else None

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        """Token ids of ``text``."""
        with self._lock:
            return list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool) -> str:
        """Text of ``ids``."""
        with self._lock:
            text = self._tokenizer.decode(
                list(ids),
                skip_special_tokens=skip_special_tokens,
                clean_up_tokenization_spaces=False,
            )
        return str(text)

    def text_stream(self, *, skip_special_tokens: bool) -> WindowedText:
        """A fresh incremental decoder for one generated sequence, a window at a time."""
        return WindowedText(functools.partial(self.decode, skip_special_tokens=skip_special_tokens))

    def token_id(self, token: str | None) -> int | None:
        """The id of ``token``'s text."""
        if not token:
            return None
        found = self._tokenizer.convert_tokens_to_ids(token)
        return None if found is None else int(found)

    def __len__(self) -> int:
        return len(self._tokenizer)


class StreamedText:
    """``IncrementalText`` by the Rust library's own incremental decoder (``DecodeStream``: the
    prefix and read offsets of ``IncrementalDetokenizer``, one call a token instead of two
    decodes). An incomplete UTF-8 character is held back; ``flush`` releases it as the tail of
    the whole sequence's text."""

    __slots__ = ("_emitted", "_held", "_ids", "_skip", "_stream", "_tokenizer")

    def __init__(self, tokenizer: Tokenizer, *, skip_special_tokens: bool) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._stream = DecodeStream(skip_special_tokens=skip_special_tokens)
        self._ids: list[int] = []
        self._emitted = 0
        """Characters of text given out so far."""
        self._held = False
        """Whether the last token's text is still held back."""

    def step(self, ids: Sequence[int]) -> str:
        """Text of the new tokens that is complete so far."""
        pieces = []
        for token in ids:
            self._ids.append(token)
            piece = self._stream.step(self._tokenizer, token)
            self._held = piece is None
            if piece:
                pieces.append(piece)
        text = pieces[0] if len(pieces) == 1 else "".join(pieces)
        self._emitted += len(text)
        return text

    def flush(self) -> str:
        """What is still held back, at the end of the sequence."""
        if not self._held:
            return ""
        self._held = False
        whole = self._tokenizer.decode(self._ids, skip_special_tokens=self._skip)
        tail = whole[self._emitted :]
        self._emitted = len(whole)
        return str(tail)


def load_folder(folder: Path) -> TextTokenizer:
    """The tokenizer of a local folder (blocking)."""
    if (folder / "tokenizer.json").is_file():
        return HubTokenizer.from_dir(folder)
    logger.warning(
        "%s has no tokenizer.json: loading it with transformers, which imports torch", folder
    )
    from transformers import AutoTokenizer

    return TransformersTokenizer(AutoTokenizer.from_pretrained(str(folder)))


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    loaded = json.loads(path.read_text(encoding="utf-8"))
    return loaded if isinstance(loaded, dict) else {}


def _token_text(value: object) -> str | None:
    """A special token as written in a config: plain text or an ``AddedToken`` object."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _chat_template(folder: Path, config: Mapping[str, Any]) -> str | dict[str, str] | None:
    """``chat_template.jinja``, else ``chat_template.json``, else the config's entry (a string or
    a list of named templates)."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    template: Any = _json(folder / "chat_template.json").get("chat_template")
    if template is None:
        template = config.get("chat_template")
    if isinstance(template, list):
        return {str(item["name"]): str(item["template"]) for item in template}
    return template if isinstance(template, str) else None
