"""Stop sequences cut streamed text like OpenAI does, across chunk boundaries."""

from __future__ import annotations

import pytest

from gateway.core.stops import Cut, StopCutter, StopMatcher, Token


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


def _tokens(*texts: str) -> list[Token]:
    return [(text, -float(index)) for index, text in enumerate(texts)]


@pytest.mark.parametrize(
    ("stops", "chunks", "text", "tokens", "stopped"),
    [
        # a stop in a token of its own: that token and the ones after it are left out
        (("STOP",), [["Hello", " ", "STOP", " more"]], "Hello ", ["Hello", " "], True),
        # a stop that begins inside a token keeps the token's part before it
        (("\n",), [["Hi", ".\n", "Bye"]], "Hi.", ["Hi", "."], True),
        # a stop spread over tokens of several chunks
        (("END",), [["a", " E"], ["N"], ["D", "x"]], "a ", ["a", " "], True),
        # text held as a possible stop that turns out not to be one comes out with its token
        (("END",), [["a", " EN"], ["tire"]], "a ENtire", ["a", " EN", "tire"], False),
        # a token without text (half a character) goes with the character's token
        (("é",), [["caf", ""], ["é", "!"]], "caf", ["caf"], True),
        (("x",), [["caf", ""], ["é", "!"]], "café!", ["caf", "", "é", "!"], False),
        # no stop: every token, a trailing token without text too
        ((), [["a", "b"], [""]], "ab", ["a", "b", ""], False),
    ],
)
def test_stop_cutter_lets_out_the_tokens_of_its_text(
    stops: tuple[str, ...], chunks: list[list[str]], text: str, tokens: list[str], stopped: bool
) -> None:
    cutter = StopCutter(stops, by_token=True)
    cuts = [cutter.feed("".join(chunk), _tokens(*chunk)) for chunk in chunks]
    cuts.append(cutter.flush())
    for cut in cuts:
        assert "".join(cut.tokens) == cut.text
        assert len(cut.logprobs) == len(cut.tokens)
    assert "".join(cut.text for cut in cuts) == text
    assert [token for cut in cuts for token in cut.tokens] == tokens
    assert cutter.stopped is stopped


def test_stop_cutter_keeps_each_tokens_log_prob() -> None:
    cutter = StopCutter(("\n",), by_token=True)
    cut = cutter.feed("ab.\nc", [("a", -0.1), ("b", -0.2), (".\n", -0.3), ("c", -0.4)])
    assert cut == Cut("ab.", ("a", "b", "."), (-0.1, -0.2, -0.3))
    assert cutter.stopped and cutter.flush() == Cut("")


def test_a_stop_cutter_without_tokens_lets_text_out_as_the_matcher_does() -> None:
    cutter = StopCutter(("STOP",), by_token=False)
    assert cutter.feed("abcS") == Cut("abc")
    assert cutter.feed("x") == Cut("Sx")
