"""The paced load-test engine in-process: made-up tokens, their schedule, stops and limits."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np
import pytest

from deploy.triton.engine.disagg.phase import RequestType
from deploy.triton.engine.types import (
    EngineError,
    EngineFinishReason,
    EngineRequest,
    SequenceOutput,
)
from deploy.triton.loadtest.paced import PacedConfig, PacedEngine, fake_tokens

PROMPT = (5, 7, 2, 9)


@dataclass
class Collected:
    expected: int = 1
    outputs: list[tuple[float, SequenceOutput]] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)

    def __call__(self, output: SequenceOutput) -> None:
        self.outputs.append((time.monotonic(), output))
        if sum(o.finished for _, o in self.outputs) == self.expected:
            self.done.set()

    def wait(self) -> list[SequenceOutput]:
        assert self.done.wait(30), "the engine did not finish the request"
        return [output for _, output in self.outputs]


def _request(name: str, **values: object) -> EngineRequest:
    fields: dict[str, object] = {"max_new_tokens": 6, "end_ids": (2,)} | values
    return EngineRequest(name, PROMPT, **fields)  # type: ignore[arg-type]


def test_fake_tokens_cycle_the_prompt_without_end_or_pad() -> None:
    assert fake_tokens(PROMPT, 6).tolist() == [5, 7, 2, 9, 5, 7]
    assert fake_tokens(PROMPT, 5, end_id=2, pad_id=9).tolist() == [5, 7, 5, 7, 5]
    assert fake_tokens(PROMPT, 3, token_id=11, end_id=2).tolist() == [11, 11, 11]
    assert fake_tokens(PROMPT, 2, token_id=2, end_id=2).tolist() == [5, 7]
    assert fake_tokens(np.array([0, 0]), 3, end_id=0, pad_id=1).tolist() == [2, 2, 2]
    assert fake_tokens(PROMPT, 4).dtype == np.int32


@pytest.fixture
def engine() -> PacedEngine:
    return PacedEngine(PacedConfig())


def test_streaming_sends_one_token_per_output_the_last_one_final(engine: PacedEngine) -> None:
    got = Collected()
    engine.submit(_request("s", streaming=True, return_log_probs=True), got)
    outputs = got.wait()
    assert [o.token_ids.tolist() for o in outputs] == [[5], [7], [9], [5], [7], [9]]
    assert [o.new_from for o in outputs] == [0, 1, 2, 3, 4, 5]
    assert [o.finish_reason for o in outputs] == [None] * 5 + [EngineFinishReason.LENGTH]
    assert [o.log_probs.size for o in outputs if o.log_probs is not None] == [1, 2, 3, 4, 5, 6]
    engine.shutdown()


def test_a_whole_answer_comes_once_with_every_sequence(engine: PacedEngine) -> None:
    got = Collected(expected=2)
    engine.submit(_request("w", num_return_sequences=2), got)
    outputs = got.wait()
    assert sorted(o.sequence_index for o in outputs) == [0, 1]
    assert all(o.token_ids.tolist() == [5, 7, 9, 5, 7, 9] and o.finished for o in outputs)
    assert all(o.log_probs is None for o in outputs)
    engine.shutdown()


def test_tokens_follow_the_pace_after_the_prefill() -> None:
    engine = PacedEngine(PacedConfig(token_s=0.05, prompt_token_s=0.05))
    got = Collected()
    start = time.monotonic()
    engine.submit(_request("p", streaming=True), got)
    got.wait()
    times = [at - start for at, _ in got.outputs]
    # The first token after the prefill (4 prompt tokens), then one each 50 ms: never sooner
    # than that schedule, which is anchored at admission (a token a busy host delays is
    # followed by the next on time, not 50 ms after it).
    assert all(at >= 0.2 + index * 0.05 - 0.005 for index, at in enumerate(times))
    engine.shutdown()


def test_outputs_carry_the_times_of_the_perf_metrics() -> None:
    """Arrival, scheduling, first and last token, in order, as the torch engine reports them."""
    engine = PacedEngine(PacedConfig(token_s=0.01, prompt_token_s=0.01))
    got = Collected()
    before = time.time_ns()
    engine.submit(_request("t", streaming=True, arrival_ns=before), got)
    outputs = got.wait()
    engine.shutdown()
    times = [o.timings for o in outputs]
    assert all(t is not None and t.arrival_ns == before for t in times)
    first, last = times[0], times[-1]
    assert first is not None and last is not None
    assert before <= first.first_scheduled_ns <= first.first_token_ns == first.last_token_ns
    assert last.first_token_ns == first.first_token_ns
    # The prefill (4 prompt tokens) and five more tokens at 10 ms each, on a schedule anchored
    # at scheduling: never sooner (the clocks may differ by a little). A first token a busy
    # host delays is followed by the next ones on time, so the gaps alone prove nothing.
    assert last.last_token_ns - first.first_scheduled_ns >= (4 + 5) * 10_000_000 - 5_000_000
    assert time.time_ns() >= last.last_token_ns


def test_a_stop_ends_the_stream_with_an_empty_final() -> None:
    engine = PacedEngine(PacedConfig(token_s=0.05))
    got = Collected()
    engine.submit(_request("c", streaming=True, max_new_tokens=100), got)
    deadline = time.monotonic() + 10
    while len(got.outputs) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    engine.stop("c")
    outputs = got.wait()
    assert outputs[-1].finish_reason is EngineFinishReason.CANCELLED
    assert outputs[-1].token_ids.size == 0
    assert len(outputs) < 100
    assert engine.stats().running_sequences == 0
    engine.shutdown()


def test_streams_beyond_the_batch_size_wait_their_turn() -> None:
    engine = PacedEngine(PacedConfig(token_s=0.02, max_batch_size=1))
    first, second = Collected(), Collected()
    engine.submit(_request("a", streaming=True), first)
    engine.submit(_request("b", streaming=True), second)
    assert engine.stats().waiting_requests == 1
    first.wait()
    second.wait()
    assert second.outputs[0][0] >= first.outputs[-1][0]
    engine.shutdown()


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"return_context_logits": True}, "no logits"),
        ({"max_new_tokens": 0}, "at least 1"),
        ({"request_type": RequestType.CONTEXT_ONLY}, "no KV cache to hand over"),
        ({"request_type": RequestType.GENERATION_ONLY}, "no KV cache to hand over"),
    ],
)
def test_what_it_cannot_serve_is_refused(
    engine: PacedEngine, values: dict[str, object], message: str
) -> None:
    with pytest.raises(EngineError, match=message):
        engine.submit(_request("x", **values), Collected())
    engine.shutdown()


def test_shutdown_ends_what_runs() -> None:
    engine = PacedEngine(PacedConfig(token_s=1.0))
    got = Collected()
    engine.submit(_request("long", streaming=True, max_new_tokens=50), got)
    engine.shutdown()
    assert got.wait()[-1].finish_reason is EngineFinishReason.CANCELLED
