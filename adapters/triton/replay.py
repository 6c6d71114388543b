"""A test double of the Triton backend's gRPC call: record a real server's responses, replay them.

Shipped beside the client it stands in for. Replaying keeps everything of the adapter that a
request runs (tensors, the exchange decoding responses into chunks) while no server is called:
what an in-process benchmark of the gateway's own CPU needs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import grpc  # type: ignore[import-untyped]

from adapters.triton.client import TritonBackend


class _Replay:
    """A finished call's responses, read again."""

    def __init__(self, responses: list[Any]) -> None:
        self._responses = iter(responses)

    async def read(self) -> Any:
        return next(self._responses, grpc.aio.EOF)

    def cancel(self) -> None:
        pass


class _Recording:
    """A live call whose responses are kept for replay."""

    def __init__(self, call: Any, into: list[Any]) -> None:
        self._call = call
        self._into = into

    async def read(self) -> Any:
        response = await self._call.read()
        if response is not grpc.aio.EOF:
            self._into.append(response)
        return response

    def cancel(self) -> None:
        self._call.cancel()


class ReplayingTritonBackend(TritonBackend):
    """The Triton backend, each call recorded once per model and streaming mode, then replayed
    once ``replaying`` is set: the Triton path without a Triton server, decoding included."""

    def __init__(self) -> None:
        super().__init__()
        self.recorded: dict[tuple[str, bytes], list[Any]] = {}
        self.replaying = False

    def _open(
        self, url: str, request: Any, timeout: float, metadata: Mapping[str, str] | None = None
    ) -> Any:
        streaming = {"stream", "streaming"}
        flags = b"".join(
            raw
            for tensor, raw in zip(request.inputs, request.raw_input_contents, strict=True)
            if tensor.name in streaming
        )
        key = (request.model_name, flags)
        if self.replaying:
            return _Replay(self.recorded[key])
        self.recorded[key] = []
        return _Recording(super()._open(url, request, timeout, metadata), self.recorded[key])
