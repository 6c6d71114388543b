"""Generated text with only some special tokens kept: the markers a model's tool-call and
reasoning formats read (gpt-oss's ``<|channel|>``, DeepSeek's call markers), every other special
token (end of turn, padding) left out as ``skip_special_tokens`` leaves them out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from deploy.triton.pipeline.detokenizer import IncrementalText


class KeptSpecialText:
    """``IncrementalText`` giving the kept special tokens' text where they come, and the other
    tokens' through ``inner``, a decoder that skips special tokens.

    ``inner`` sees every other token in one stream, so the text after a kept token decodes as
    it would have without it (a leading space is not taken for the start of a sequence)."""

    __slots__ = ("_inner", "_kept")

    def __init__(self, inner: IncrementalText, kept: Mapping[int, str]) -> None:
        self._inner = inner
        self._kept = kept

    def step(self, ids: Sequence[int]) -> str:
        """Text of the new tokens that is complete so far."""
        kept = self._kept
        if not any(token in kept for token in ids):
            return self._inner.step(ids)
        pieces: list[str] = []
        start = 0
        for index, token in enumerate(ids):
            marker = kept.get(token)
            if marker is None:
                continue
            pieces.append(self._inner.step(ids[start:index]))
            # A character held back before the marker belongs before it.
            pieces.append(self._inner.flush())
            pieces.append(marker)
            start = index + 1
        pieces.append(self._inner.step(ids[start:]))
        return "".join(pieces)

    def flush(self) -> str:
        """What is still held back, at the end of the sequence."""
        return self._inner.flush()
