"""Stop sequences cut streamed text like OpenAI does, across chunk boundaries."""

from __future__ import annotations

import pytest

from gateway.core.stops import StopMatcher


@pytest.mark.parametrize(
    ("stops", "chunks", "emitted", "stopped"),
    [
        ((), ["Hello", " world"], "Hello world", False),
        (("STOP",), ["Hello STOP more"], "Hello ", True),
        (("STOP",), ["Hello ST", "OP more"], "Hello ", True),
        (("STOP",), ["Hello S", "T", "O", "P"], "Hello ", True),
        (("STOP",), ["Hello ST", "ART"], "Hello START", False),
        (("STOP",), ["ends with ST"], "ends with ST", False),
        (("\n\n", "END"), ["a\n", "b\n", "\nc"], "a\nb", True),
        (("END", "\n\n"), ["xEN", "D\n\n"], "x", True),
        (("ab", "b"), ["ab"], "", True),
        (("aab",), ["a", "a", "a", "b"], "a", True),
        (("",), ["text"], "text", False),
        (("é",), ["caf", "é au lait"], "caf", True),
    ],
)
def test_stop_matcher(
    stops: tuple[str, ...], chunks: list[str], emitted: str, stopped: bool
) -> None:
    matcher = StopMatcher(stops)
    out = "".join(matcher.feed(chunk) for chunk in chunks)
    if not matcher.stopped:
        out += matcher.flush()
    assert out == emitted
    assert matcher.stopped is stopped


def test_nothing_is_emitted_after_a_stop() -> None:
    matcher = StopMatcher(("x",))
    assert matcher.feed("axb") == "a"
    assert matcher.feed("more") == ""
    assert matcher.flush() == ""


def test_held_text_is_only_what_could_start_a_stop() -> None:
    matcher = StopMatcher(("STOP",))
    assert matcher.feed("abcS") == "abc"
    assert matcher.feed("x") == "Sx"
