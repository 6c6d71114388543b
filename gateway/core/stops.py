"""Stop sequences in streamed text: emit what is safe, hold back what might start a stop."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass


class StopMatcher:
    """Cuts a text stream before the first stop sequence, even when it spans chunks.

    OpenAI leaves the stop sequence out of the output; TensorRT-LLM keeps it. Text that could
    be the beginning of a stop sequence is held back until the next chunk settles it.
    """

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = tuple(stop for stop in stops if stop)
        self._held = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        """Add generated text; returns the part that can be emitted now."""
        if self.stopped:
            return ""
        if not self._stops:
            return text
        pending = self._held + text
        cut = self._first_stop(pending)
        if cut is not None:
            self.stopped = True
            self._held = ""
            return pending[:cut]
        keep = self._partial_stop_length(pending)
        self._held = pending[len(pending) - keep :] if keep else ""
        return pending[: len(pending) - keep]

    def flush(self) -> str:
        """The text still held back once generation ended without a stop."""
        held, self._held = self._held, ""
        return held

    def _first_stop(self, text: str) -> int | None:
        """Where to cut: before the stop that completes first, as generation meets it (of two
        ending together, the longer)."""
        found = [
            (index + len(stop), index) for stop in self._stops if (index := text.find(stop)) >= 0
        ]
        return min(found)[1] if found else None

    def _partial_stop_length(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of a stop."""
        longest = 0
        for stop in self._stops:
            for size in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:size]):
                    longest = size
                    break
        return longest


Token = tuple[str, float | None]
"""A generated token's text and its log probability (None where the engine gave none)."""


@dataclass(frozen=True, slots=True)
class Cut:
    """Text let out of a :class:`StopCutter`, with the tokens and log probs behind exactly it."""

    text: str
    tokens: tuple[str, ...] = ()
    logprobs: tuple[float, ...] = ()

    def __add__(self, other: Cut) -> Cut:
        return Cut(
            self.text + other.text, self.tokens + other.tokens, self.logprobs + other.logprobs
        )


class StopCutter:
    """A :class:`StopMatcher` that, with ``by_token``, lets text out a whole token at a time, so
    that the tokens and log probs let out with it spell exactly that text.

    A token a stop sequence cuts keeps only its part before the stop, and the tokens after the
    cut are dropped: the log probs of an answer describe the answer returned, as OpenAI's and
    vLLM's do, not the text the engine went on to generate. Without ``by_token`` text is let out
    as soon as it cannot begin a stop, and no tokens come with it.
    """

    def __init__(self, stops: tuple[str, ...], *, by_token: bool) -> None:
        self._matcher = StopMatcher(stops)
        self._by_token = by_token
        self._safe = ""
        """Text the matcher let go that is not out yet: it ends inside a held token."""
        self._held: deque[Token] = deque()

    @property
    def stopped(self) -> bool:
        """Whether a stop sequence ended the text."""
        return self._matcher.stopped

    def feed(self, text: str, tokens: Sequence[Token] = ()) -> Cut:
        """Add generated text and the tokens that spell it (``text`` as one token without a log
        prob when none are given); returns what can be let out now."""
        if not self._by_token:
            return Cut(self._matcher.feed(text))
        if self.stopped:
            return Cut("")
        self._held.extend(tokens or ((text, None),))
        self._safe += self._matcher.feed(text)
        return self._let_out()

    def flush(self) -> Cut:
        """What is still held once generation ended."""
        self._safe += self._matcher.flush()
        if not self._by_token:
            held, self._safe = self._safe, ""
            return Cut(held)
        return self._let_out(ended=True)

    def _let_out(self, ended: bool = False) -> Cut:
        """The held tokens the safe text covers. A token without text belongs to the text after
        it (a character split across tokens), so it waits for that text, or, after a stop, is
        dropped with it; once generation ended without a stop, every token is out."""
        final = self.stopped or ended
        texts: list[str] = []
        tokens: list[str] = []
        logprobs: list[float] = []
        used = 0
        while self._held:
            token, logprob = self._held[0]
            end = used + len(token)
            if end > len(self._safe) or (used == len(self._safe) and not ended):
                if not self.stopped or used >= len(self._safe):
                    break
                token = self._safe[used:]
            self._held.popleft()
            texts.append(token)
            used += len(token)
            if logprob is not None:
                tokens.append(token)
                logprobs.append(logprob)
        if final:
            self._held.clear()
            self._safe = ""
        else:
            self._safe = self._safe[used:]
        return Cut("".join(texts), tuple(tokens), tuple(logprobs))
