"""Stop sequences in streamed text: emit what is safe, hold back what might start a stop."""

from __future__ import annotations


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
