"""Translation of a request's successive Triton responses into neutral token chunks."""

from __future__ import annotations

import codecs
import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import numpy as np
import numpy.typing as npt

from adapters.contract import BackendError, Beam, GenerationRequest, TextStream, TokenChunk
from adapters.triton.beams import beam_rows
from adapters.triton.config import REUSED_BLOCKS, ModelInputs
from adapters.triton.errors import classify
from adapters.triton.tensors import requested_outputs, streams
from adapters.triton.wire import JsonOutputs, RawOutputs, first_bytes, first_int

logger = logging.getLogger(__name__)

Outputs = Mapping[str, npt.NDArray[Any]]
CountSource = Literal["reported", "logprobs", "none"]


class ResponseDecoder:
    """Decodes the responses of one request, in order, into ``TokenChunk`` deltas.

    ``text_output`` bytes go through an incremental UTF-8 decoder, so a character split across
    responses comes out whole. With ``cumulative`` (a streaming BLS with ``accumulate_tokens``)
    each ``text_output`` holds the whole text so far and only the new suffix is emitted.
    ``counts`` says where token counts come from: ``num_output_tokens`` (``reported``), the
    number of log probs (``logprobs``, for releases without count outputs), or nowhere
    (``none``: ``token_count`` is ``None`` and the gateway counts with its own tokenizer).
    ``keep_logprobs`` says whether the client asked for the log probs themselves. ``echo_prefix``
    is stripped from the start of the text: a deployment that cannot exclude the prompt from
    non-streamed output echoes it.
    """

    def __init__(
        self,
        *,
        cumulative: bool = False,
        counts: CountSource = "reported",
        keep_logprobs: bool = True,
        echo_prefix: str = "",
        tokens_per_block: int | None = None,
        beams: bool = False,
    ) -> None:
        self._beams = beams
        self._cumulative = cumulative
        self._tokens_per_block = tokens_per_block
        self._counts = counts
        self._keep_logprobs = keep_logprobs
        self._echo_prefix = echo_prefix
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._seen = b""
        self._started = False
        self._logprobs = LogprobCursor()

    def decode(self, outputs: Outputs, *, final: bool = False) -> TokenChunk:
        """The chunk for one response; ``final`` for the request's last one."""
        if self._beams:
            return self._beam_texts(outputs, final=final)
        text = self._text(outputs, final=final)
        reported = first_int(outputs, "num_output_tokens")
        logprobs = self._logprobs.new(outputs.get("output_log_probs"), reported)
        count: int | None = None
        if self._counts == "reported":
            count = reported or 0
        elif self._counts == "logprobs":
            count = len(logprobs)
        return TokenChunk(
            text=text,
            token_count=count,
            prompt_tokens=first_int(outputs, "num_input_tokens"),
            logprobs=logprobs if self._keep_logprobs else (),
            final=final,
            cached_tokens=cached_tokens(outputs, self._tokens_per_block),
            context_phase_params=_handoff(outputs),
        )

    def finish(self) -> TokenChunk:
        """A closing chunk for a stream that ended without a response flagged final."""
        return self.decode({}, final=True)

    def _beam_texts(self, outputs: Outputs, *, final: bool) -> TokenChunk:
        """Every beam's whole text (a beam search is answered once); the gateway counts each
        beam's tokens itself."""
        array = outputs.get("text_output")
        raw = [] if array is None else list(array.reshape(-1))
        texts = tuple(
            (item if isinstance(item, bytes) else str(item).encode())
            .decode("utf-8", "replace")
            .removeprefix(self._echo_prefix)
            for item in raw
        )
        return TokenChunk(
            text=texts[0] if texts else "",
            token_count=None,
            prompt_tokens=first_int(outputs, "num_input_tokens"),
            final=final,
            cached_tokens=cached_tokens(outputs, self._tokens_per_block),
            beams=tuple(Beam(text) for text in texts),
        )

    def _text(self, outputs: Outputs, *, final: bool) -> str:
        raw = first_bytes(outputs, "text_output")
        if self._cumulative and raw is not None:
            raw = self._delta(raw)
        text = self._utf8.decode(raw or b"", final=final)
        if text and not self._started:
            self._started = True
            text = text.removeprefix(self._echo_prefix)
        return text

    def _delta(self, cumulative: bytes) -> bytes:
        seen, self._seen = self._seen, cumulative
        if cumulative.startswith(seen):
            return cumulative[len(seen) :]
        common = _common_prefix_length(seen, cumulative)
        logger.warning(
            "cumulative text rewrote %d already streamed bytes; emitting from the divergence",
            len(seen) - common,
        )
        return cumulative[common:]


class LogprobCursor:
    """The log probs of each response's new tokens.

    TensorRT-LLM sends every log prob generated so far with each streamed response, and pads
    rows past their length: the new ones follow those already seen, ``count`` of them when the
    response says how many tokens it carries.
    """

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        self._seen = 0

    def new(self, array: npt.NDArray[Any] | None, count: int | None) -> tuple[float, ...]:
        """This response's new log probs."""
        if array is None or array.size == 0:
            return ()
        row = _first_row(array)
        start = self._seen
        new = row[start:] if count is None else row[start : start + count]
        self._seen = start + len(new)
        return tuple(new.tolist())


class EngineDecoder:
    """Decodes the responses of a request sent to ``tensorrt_llm`` itself: token ids to text.

    Streamed responses carry only their new ids; a whole answer carries every id, the prompt's
    first unless the engine excluded them (``echoed`` is the prompt to drop from its start). Token
    counts are exact: one per id. ``text`` turns ids into text as the pipeline's
    postprocessing would; ``beam_text`` gives a fresh one for each beam of a beam search.
    """

    def __init__(
        self,
        text: TextStream,
        *,
        prompt_tokens: int,
        echoed: Sequence[int] = (),
        keep_logprobs: bool = True,
        tokens_per_block: int | None = None,
        beam_text: Callable[[], TextStream] | None = None,
    ) -> None:
        self._text = text
        self._beam_text = beam_text
        self._tokens_per_block = tokens_per_block
        self._prompt_tokens = prompt_tokens
        self._echoed = list(echoed)
        self._keep_logprobs = keep_logprobs
        self._logprobs = LogprobCursor()

    def decode(self, outputs: Outputs, *, final: bool = False) -> TokenChunk:
        """The chunk for one response; ``final`` for the request's last one."""
        if self._beam_text is not None:
            return self._beam_chunk(outputs, final=final)
        ids = _ids(outputs)
        if self._echoed and ids:
            if ids[: len(self._echoed)] == self._echoed:
                ids = ids[len(self._echoed) :]
            self._echoed = []
        text = self._text.step(ids) if ids else ""
        if final:
            text += self._text.flush()
        logprobs = self._logprobs.new(outputs.get("output_log_probs"), len(ids))
        return TokenChunk(
            text=text,
            token_count=len(ids),
            prompt_tokens=self._prompt_tokens,
            logprobs=logprobs if self._keep_logprobs else (),
            final=final,
            cached_tokens=cached_tokens(outputs, self._tokens_per_block),
            context_phase_params=_handoff(outputs),
        )

    def finish(self) -> TokenChunk:
        """A closing chunk for a stream that ended without a response flagged final."""
        return self.decode({}, final=True)

    def _beam_chunk(self, outputs: Outputs, *, final: bool) -> TokenChunk:
        """Every beam of a search answered whole: each beam's ids cut to its
        ``sequence_length`` (the prompt dropped where the engine echoed it) and decoded on their
        own, with the first as many entries of its ``output_log_probs`` row as it has ids."""
        assert self._beam_text is not None
        beams = []
        for ids, logprobs in beam_rows(outputs):
            if self._echoed and ids[: len(self._echoed)] == self._echoed:
                ids = ids[len(self._echoed) :]
            stream = self._beam_text()
            text = stream.step(ids) + stream.flush() if ids else ""
            kept = tuple(logprobs[: len(ids)].tolist()) if self._keep_logprobs else ()
            beams.append(Beam(text, len(ids), kept))
        return TokenChunk(
            text=beams[0].text if beams else "",
            token_count=sum(beam.token_count or 0 for beam in beams),
            prompt_tokens=self._prompt_tokens,
            final=final,
            cached_tokens=cached_tokens(outputs, self._tokens_per_block),
            beams=tuple(beams),
        )


def _handoff(outputs: Outputs) -> bytes | None:
    """A context-only answer's ``context_phase_params``, as the bytes they are."""
    array = outputs.get("context_phase_params")
    if array is None or array.size == 0:
        return None
    return np.asarray(array, dtype=np.uint8).reshape(-1).tobytes()


def cached_tokens(outputs: Outputs, tokens_per_block: int | None) -> int | None:
    """Prompt tokens the engine found cached: its reused KV-cache blocks, in tokens."""
    if tokens_per_block is None:
        return None
    blocks = first_int(outputs, REUSED_BLOCKS)
    if blocks is None:
        return None
    return max(0, blocks) * tokens_per_block


_READ_AS_VALUES = (RawOutputs, JsonOutputs)


def _ids(outputs: Outputs) -> list[int]:
    """The first beam's ids of a response, cut to its ``sequence_length``."""
    # The type itself, not ``isinstance``: for a ``Mapping`` that walks the ABC's registry.
    if type(outputs) in _READ_AS_VALUES:
        ids = cast("RawOutputs | JsonOutputs", outputs).ints("output_ids")
        if ids is not None:
            length = first_int(outputs, "sequence_length")
            return ids if length is None else ids[:length]
    tokens = outputs.get("output_ids")
    if tokens is None or tokens.size == 0:
        return []
    row = tokens.reshape(-1, tokens.shape[-1])[0]
    length = first_int(outputs, "sequence_length")
    return list(row[: len(row) if length is None else length].tolist())


def merge_chunks(chunks: Sequence[TokenChunk]) -> TokenChunk:
    """One final chunk holding everything: a non-streamed answer may span several responses."""
    return dataclasses.replace(join_chunks(chunks), final=True)


def join_chunks(chunks: Sequence[TokenChunk]) -> TokenChunk:
    """One chunk holding several in order (streamed responses that arrived together); final if
    the last one is."""
    beams = [chunk.beams for chunk in chunks if chunk.beams]
    counts = [chunk.token_count for chunk in chunks]
    prompt_tokens = [chunk.prompt_tokens for chunk in chunks if chunk.prompt_tokens is not None]
    cached = [chunk.cached_tokens for chunk in chunks if chunk.cached_tokens is not None]
    handoffs = [chunk.context_phase_params for chunk in chunks if chunk.context_phase_params]
    return TokenChunk(
        text="".join(chunk.text for chunk in chunks),
        token_count=None if None in counts else sum(count or 0 for count in counts),
        prompt_tokens=prompt_tokens[0] if prompt_tokens else None,
        logprobs=tuple(value for chunk in chunks for value in chunk.logprobs),
        final=chunks[-1].final,
        cached_tokens=cached[0] if cached else None,
        beams=beams[-1] if beams else (),
        context_phase_params=handoffs[-1] if handoffs else None,
    )


def _first_row(array: npt.NDArray[Any] | None) -> npt.NDArray[np.float64]:
    """The first sequence's per-token log probs (``[1, beams, n]`` or ``[1, n]``)."""
    if array is None or array.size == 0:
        return np.zeros(0, np.float64)
    row: npt.NDArray[np.float64] = np.asarray(array, dtype=np.float64).reshape(-1, array.shape[-1])[
        0
    ]
    return row


def _common_prefix_length(left: bytes, right: bytes) -> int:
    length = 0
    for a, b in zip(left, right, strict=False):
        if a != b:
            break
        length += 1
    return length


@dataclass(slots=True)
class Reply:
    """One response of a Triton stream, as the exchange reads it (not frozen: one is built for
    every streamed token, and a frozen dataclass takes twice as long to build)."""

    outputs: Outputs
    final: bool | None = None
    """Triton's final-response flag; ``None`` when the response carries none."""
    error: str = ""
    """An in-band error message (the request failed)."""


@dataclass(slots=True)
class Exchange:
    """One request's Triton responses in, its token chunks out; no I/O.

    Streaming requests yield a chunk per response; others hold their chunks and yield one merged
    chunk at the end. ``finished`` turns true with the final response, the stream's end or an
    in-band error (raised as the contract's ``BackendError``).
    """

    model: ModelInputs
    decoder: ResponseDecoder | EngineDecoder
    outputs: list[str]
    streaming: bool
    finished: bool = False
    held: list[TokenChunk] = field(default_factory=list)

    @classmethod
    def of(cls, request: GenerationRequest, model: ModelInputs) -> Exchange:
        """The exchange of ``request`` with ``model``: what to ask for and how to decode it."""
        streaming = streams(request, model)
        return cls(model, _decoder(request, model, streaming), requested_outputs(request, model),
                   streaming)  # fmt: skip

    def on_replies(self, replies: Sequence[Reply] | None) -> TokenChunk | None:
        """One chunk for the replies that arrived together (``None``: the stream ended)."""
        if replies is None:
            return self.on_reply(None)
        chunks = []
        for reply in replies:
            chunk = self.on_reply(reply)
            if chunk is not None:
                chunks.append(chunk)
            if self.finished:
                break
        return chunks[0] if len(chunks) == 1 else join_chunks(chunks) if chunks else None

    def on_reply(self, reply: Reply | None) -> TokenChunk | None:
        """The chunk to pass on now for ``reply`` (``None``: the stream ended), if any."""
        if reply is None:
            self.finished = True
            chunk = self.decoder.finish()
        elif reply.error:
            self.finished = True
            raise classify(reply.error)
        else:
            self.finished = reply.final if reply.final is not None else not self.model.decoupled
            chunk = self.decoder.decode(reply.outputs, final=self.finished)
        if self.streaming:
            return chunk
        self.held.append(chunk)
        return merge_chunks(self.held) if self.finished else None


def _decoder(
    request: GenerationRequest, model: ModelInputs, streaming: bool
) -> ResponseDecoder | EngineDecoder:
    """How responses become chunks: text outputs, or token ids through the gateway's tokenizer."""
    echoes = not streaming and "exclude_input_in_output" not in model.accepted
    block = model.tokens_per_block if model.reports_cached_tokens else None
    if model.is_engine:
        if request.tokens is None:
            raise BackendError(f"{model.name} returns token ids: the request has no tokenizer")
        return EngineDecoder(
            request.tokens.text_stream(),
            prompt_tokens=len(request.prompt_ids),
            echoed=request.prompt_ids if echoes else (),
            keep_logprobs=request.params.logprobs,
            tokens_per_block=block,
            beam_text=request.tokens.text_stream if request.params.beam is not None else None,
        )
    return ResponseDecoder(
        cumulative=streaming and model.accumulate_tokens,
        counts=_count_source(model),
        keep_logprobs=request.params.logprobs,
        echo_prefix=request.prompt if echoes else "",
        tokens_per_block=block,
        beams=request.params.beam is not None,
    )


def _count_source(model: ModelInputs) -> CountSource:
    if model.reports_output_tokens:
        return "reported"
    return "logprobs" if model.counts_by_logprobs else "none"
