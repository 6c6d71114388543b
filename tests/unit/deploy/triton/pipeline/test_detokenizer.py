"""Incremental detokenization: streamed deltas concatenate to exactly the whole decoded text."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from deploy.triton.pipeline.detokenizer import DetokenizerCache, IncrementalDetokenizer
from deploy.triton.pipeline.tokenization import decode

TEXTS = [
    "héllo 世界 🎉 naïve",
    "Hello world, the capital of France is Paris.",
    "  two leading spaces and trailing  ",
    "emoji 👩‍👩‍👧 family, flags 🇫🇷🇯🇵 and ∑ math ≠ ascii",
    "日本語のテキストです。",
    "tabs\tand\nnewlines\n\n end",
    "é",
    "🎉",
]
CHUNKINGS = [1, 2, 3, 5, 1000]


def _metaspace_tokenizer() -> Any:
    """A Llama-2 style tokenizer: metaspace pieces, byte fallback, first leading space stripped."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    letters = [chr(c) for c in range(0x21, 0x7F)] + ["▁"]
    merges = [("▁", c) for c in "abcdefghijklmnopqrstuvwxyzHPFT"] + [("l", "l"), ("▁t", "h")]
    vocab = {piece: i for i, piece in enumerate(pieces + letters + [a + b for a, b in merges])}
    model = models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True)
    tok = Tokenizer(model)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(content=" ", left=1, right=0),
        ]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


@pytest.fixture(scope="module", params=["tiny-byte-level", "metaspace-byte-fallback"])
def tokenizer(request: pytest.FixtureRequest, tiny_model_dir: Path) -> Any:
    if request.param == "tiny-byte-level":
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(tiny_model_dir)
    return _metaspace_tokenizer()


def _decoder(tokenizer: Any) -> Callable[[Sequence[int]], str]:
    return lambda ids: decode(tokenizer, ids, skip_special_tokens=True)


def _chunks(ids: list[int], size: int) -> list[list[int]]:
    return [ids[i : i + size] for i in range(0, len(ids), size)]


def _stream(tokenizer: Any, ids: list[int], size: int) -> list[str]:
    detokenizer = IncrementalDetokenizer()
    deltas = [detokenizer.step(chunk, _decoder(tokenizer)) for chunk in _chunks(ids, size)]
    return [*deltas, detokenizer.flush(_decoder(tokenizer))]


@pytest.mark.parametrize("size", CHUNKINGS)
@pytest.mark.parametrize("text", TEXTS)
def test_streamed_deltas_concatenate_to_the_whole_text(
    tokenizer: Any, text: str, size: int
) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    whole = decode(tokenizer, ids, skip_special_tokens=True)
    deltas = _stream(tokenizer, ids, size)
    assert "".join(deltas) == whole
    assert deltas[-1] == ""
    assert all("\ufffd" not in delta for delta in deltas)


@pytest.mark.parametrize("text", ["héllo 世界 🎉 naïve", "Hello world there"])
def test_stateless_chunk_decoding_is_what_we_fix(text: str) -> None:
    """Decoding each token alone (the stock ensemble) breaks characters or drops spaces."""
    tokenizer = _metaspace_tokenizer()
    ids = tokenizer.encode(text, add_special_tokens=False)
    naive = "".join(decode(tokenizer, [token], skip_special_tokens=True) for token in ids)
    assert naive != text
    assert "".join(_stream(tokenizer, ids, 1)) == text


def test_multibyte_character_is_held_back_until_complete(tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = tokenizer.encode("a🎉", add_special_tokens=False)
    assert len(ids) >= 3, "the emoji must span several byte tokens for this test"
    deltas = _stream(tokenizer, ids, 1)
    assert deltas[0] == "a"
    assert deltas[1:-2] == [""] * (len(ids) - 2)
    assert deltas[-2] == "🎉"


def test_flush_releases_an_incomplete_tail(tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = tokenizer.encode("ok🎉", add_special_tokens=False)[:-1]
    detokenizer = IncrementalDetokenizer()
    streamed = detokenizer.step(ids, _decoder(tokenizer))
    assert "\ufffd" not in streamed
    assert streamed + detokenizer.flush(_decoder(tokenizer)) == decode(
        tokenizer, ids, skip_special_tokens=True
    )


def test_window_stays_short(tokenizer: Any) -> None:
    ids = tokenizer.encode(" ".join(TEXTS) * 4, add_special_tokens=False)
    detokenizer = IncrementalDetokenizer()
    longest = 0
    for token in ids:
        detokenizer.step([token], _decoder(tokenizer))
        longest = max(longest, len(detokenizer.window))
    assert longest <= 8


def test_two_window_protocol_matches_local_step(tokenizer: Any) -> None:
    """The BLS decodes the (prefix, full) windows remotely; the result is the same."""
    ids = tokenizer.encode(TEXTS[0], add_special_tokens=False)
    local, remote = IncrementalDetokenizer(), IncrementalDetokenizer()
    decode_ids = _decoder(tokenizer)
    for token in ids:
        prefix, full = remote.extend([token])
        from_windows = remote.advance(decode_ids(prefix), decode_ids(full))
        assert from_windows == local.step([token], decode_ids)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_cache_keeps_state_per_key() -> None:
    cache = DetokenizerCache()
    assert cache.get(("a", 0, 0)) is cache.get(("a", 0, 0))
    assert cache.get(("a", 0, 0)) is not cache.get(("b", 0, 0))
    assert len(cache) == 2


def test_cache_evicts_least_recently_used() -> None:
    cache = DetokenizerCache(max_entries=2)
    first = cache.get("one")
    cache.get("two")
    cache.get("one")
    cache.get("three")
    assert "two" not in cache
    assert cache.get("one") is first
    assert len(cache) == 2


def test_cache_evicts_idle_entries() -> None:
    clock = FakeClock()
    cache = DetokenizerCache(ttl_s=10, clock=clock)
    stale = cache.get("stale")
    clock.now = 5
    cache.get("fresh")
    clock.now = 12
    cache.get("fresh")
    assert "stale" not in cache
    assert cache.get("stale") is not stale


def test_cache_discard() -> None:
    cache = DetokenizerCache()
    cache.get("x")
    cache.discard("x")
    cache.discard("never")
    assert len(cache) == 0


def _streamed_text(tokenizer: Any, ids: list[int], size: int, *, skip: bool = True) -> list[str]:
    from deploy.triton.pipeline.tokenizer_folder import HubTokenizer

    stream = HubTokenizer(tokenizer.backend_tokenizer, {}).text_stream(skip_special_tokens=skip)
    return [*(stream.step(chunk) for chunk in _chunks(ids, size)), stream.flush()]


@pytest.mark.parametrize("size", CHUNKINGS)
@pytest.mark.parametrize("text", TEXTS)
def test_the_rust_decoder_streams_what_the_window_streams(
    tokenizer: Any, text: str, size: int
) -> None:
    """The Rust library's incremental decoder (the gateway's, for a tokenizer.json): deltas that
    concatenate to the whole text, a token at a time the windowed decoder's own; of several
    tokens at once it passes on the complete characters before an incomplete one, where the
    window holds back the whole chunk."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    deltas = _streamed_text(tokenizer, ids, size)
    assert "".join(deltas) == decode(tokenizer, ids, skip_special_tokens=True)
    assert all("\ufffd" not in delta for delta in deltas)
    assert deltas[-1] == ""
    windowed = _stream(tokenizer, ids, size)
    if size == 1:
        assert deltas == windowed
    for count in range(1, len(deltas)):
        assert "".join(deltas[:count]).startswith("".join(windowed[:count])), "never later"


@pytest.mark.parametrize("skip", [True, False])
def test_the_rust_decoder_skips_special_tokens_as_asked(tokenizer: Any, skip: bool) -> None:
    special = tokenizer.eos_token_id
    ids = [special, *tokenizer.encode(TEXTS[1], add_special_tokens=False), special]
    deltas = _streamed_text(tokenizer, ids, 1, skip=skip)
    assert "".join(deltas) == decode(tokenizer, ids, skip_special_tokens=skip)
    assert (tokenizer.eos_token in "".join(deltas)) is not skip


def test_the_rust_decoder_holds_back_and_flushes_an_incomplete_tail(tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = tokenizer.encode("a🎉", add_special_tokens=False)
    deltas = _streamed_text(tokenizer, ids, 1)
    assert deltas[0] == "a" and deltas[-2] == "🎉" and deltas[-1] == ""
    assert deltas[1:-2] == [""] * (len(ids) - 2)
    cut = _streamed_text(tokenizer, ids[:-1], 1)
    assert "\ufffd" not in "".join(cut[:-1])
    assert "".join(cut) == decode(tokenizer, ids[:-1], skip_special_tokens=True)
    assert cut[-1].endswith("\ufffd")


def test_without_the_rust_decoder_the_window_streams(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tokenizers release without ``DecodeStream`` (older Triton containers run the pipeline
    models on one) still loads the module and streams a window at a time."""
    from deploy.triton.pipeline import tokenizer_folder

    monkeypatch.setattr(tokenizer_folder, "DecodeStream", None)
    ids = tokenizer.encode(TEXTS[0], add_special_tokens=False)
    hub = tokenizer_folder.HubTokenizer(tokenizer.backend_tokenizer, {})
    stream = hub.text_stream(skip_special_tokens=True)
    assert not isinstance(stream, tokenizer_folder.StreamedText)
    deltas = [stream.step([token]) for token in ids] + [stream.flush()]
    assert deltas == _stream(tokenizer, ids, 1)
