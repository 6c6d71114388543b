"""A part of the runtime that does not close in time does not hold the shutdown: the others
still close, and the stuck one is named."""

from __future__ import annotations

import asyncio
import logging

import pytest

from gateway.runtime import base as runtime


async def test_a_stuck_part_is_given_up_on_and_named(caplog: pytest.LogCaptureFixture) -> None:
    closed: list[str] = []

    async def stuck() -> None:
        await asyncio.Event().wait()

    async def quick() -> None:
        closed.append("quick")

    with caplog.at_level(logging.WARNING, "gateway.runtime"):
        await runtime._bounded("the stuck part", stuck(), 0.2)
        await runtime._bounded("the quick part", quick(), 0.2)
    assert closed == ["quick"]
    assert "closing the stuck part took more than 0.2 s" in caplog.text
    assert "quick part" not in caplog.text
