"""Work raced against the client's disconnect: work that never waits is done with no watcher,
work that waits is cancelled when the client leaves, its own result, error or cancellation
otherwise goes through unchanged."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.errors import ClientDisconnected
from gateway.http.answers import until_disconnect


class Client:
    def __init__(self) -> None:
        self.reads = 0
        self.left = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        self.reads += 1
        await self.left.wait()
        return {"type": "http.disconnect"}


async def test_work_that_never_waits_is_done_without_a_watcher() -> None:
    client = Client()

    async def quick() -> int:
        return 5

    tasks = len(asyncio.all_tasks())
    assert await until_disconnect(client.receive, quick()) == 5
    await asyncio.sleep(0)
    assert client.reads == 0 and len(asyncio.all_tasks()) == tasks


async def test_work_that_waits_gets_its_values_and_errors_through() -> None:
    client = Client()

    async def slow() -> int:
        future = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(0.01, future.set_result, 6)
        return await future + 1

    assert await until_disconnect(client.receive, slow()) == 7

    async def failing() -> None:
        await asyncio.sleep(0)
        raise ValueError("the engine said no")

    with pytest.raises(ValueError, match="the engine said no"):
        await until_disconnect(client.receive, failing())

    async def chunks() -> Any:
        await asyncio.sleep(0.001)
        yield "first"

    stream = chunks()
    assert await until_disconnect(client.receive, anext(stream, None)) == "first"
    assert await until_disconnect(client.receive, anext(stream, None)) is None
    await asyncio.sleep(0)
    assert client.reads >= 1


async def test_a_client_that_leaves_cancels_work_that_waits() -> None:
    client = Client()
    cleaned = asyncio.Event()

    async def forever() -> None:
        try:
            await asyncio.sleep(30)
        finally:
            cleaned.set()

    asyncio.get_running_loop().call_later(0.01, client.left.set)
    with pytest.raises(ClientDisconnected):
        await until_disconnect(client.receive, forever())
    assert cleaned.is_set()
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0


async def test_the_callers_own_cancellation_goes_through() -> None:
    client = Client()

    async def forever() -> None:
        await asyncio.sleep(30)

    waiting = asyncio.ensure_future(until_disconnect(client.receive, forever()))
    await asyncio.sleep(0.01)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
