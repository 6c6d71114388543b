"""Stop requests and gRPC cancellation free the engine's batch slot for a waiting request."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from deploy.sidecar.supervisor import Sidecar
from tests.support.engine_grpc import Stream, request, stop, tokens_of

pytestmark = pytest.mark.slow

SLOTS = 16  # torch_max_batch_size of the `tiny` pipeline in tests/conftest.py
LONG = 3000


@pytest.fixture
def full_engine(sidecar: Sidecar) -> Iterator[list[Stream]]:
    """Every batch slot of the engine busy with a long generation that has started."""
    streams = [Stream(sidecar, request(LONG, streaming=True, end_id=-1)) for _ in range(SLOTS)]
    for stream in streams:
        outputs, final = stream.next()
        assert outputs["output_ids"].shape == (1, 1, 1) and not final
    yield streams
    for stream in streams:
        if stream.open:
            stop(sidecar, stream.request_id)
            stream.collect()


def _served_while_others_run(sidecar: Sidecar, others: list[Stream]) -> None:
    """A new request completes while the other long generations are still running.

    With no free slot it would wait for one of them to finish all its tokens.
    """
    waiting = Stream(sidecar, request(8, streaming=True, end_id=-1))
    assert len(tokens_of(waiting.collect())) == 8
    for other in others:
        received = other.received()
        assert received, "every long generation is still producing tokens"
        assert not any(final for _, final in received), "a long generation ended first"


def test_stop_request_ends_generation_and_frees_the_slot(
    sidecar: Sidecar, full_engine: list[Stream]
) -> None:
    victim, others = full_engine[0], full_engine[1:]
    stop(sidecar, victim.request_id)
    rest = victim.collect()
    assert rest[-1][1]
    assert len(tokens_of(rest)) < LONG - 1, "the stopped generation ran to its end"
    _served_while_others_run(sidecar, others)


def test_grpc_cancellation_frees_the_slot(sidecar: Sidecar, full_engine: list[Stream]) -> None:
    victim, others = full_engine[0], full_engine[1:]
    victim.close(cancel=True)
    served = Stream(sidecar, request(1, streaming=True, end_id=-1)).collect()
    assert len(tokens_of(served)) == 1
    _served_while_others_run(sidecar, others)
