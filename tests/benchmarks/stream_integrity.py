"""Whether every streamed response arrives: Triton's HTTP ``generate_stream`` against gRPC.

One tritonserver serves the zero-compute load-test engine as the ``tensorrt_llm`` model. The
same streamed requests (``--tokens`` responses each, ``--streams`` at once, for ``--seconds``)
go through the gateway's two transports to Triton: ``http``, ``generate_stream`` on a connection
per request (``adapters.triton.http.call``), and ``grpc``, ``ModelStreamInfer`` on one channel
(``adapters.triton.grpc.stream``). Each request is counted as

- ``complete``: it ended with exactly ``--tokens`` responses;
- ``short``: it ended normally with fewer (responses the engine sent were never written);
- ``stalled``: no end within ``--timeout`` seconds;
- ``broken``: the transport failed (a reset, or bytes that are not the answer's).

``--keeper`` runs tritonserver without the response keeper (``deploy.sidecar.frontend.keeper``),
with it, or both one after the other (the default).
``--http-threads`` sets tritonserver's ``--http-thread-count`` (Triton's default is 8): fewer
threads, or cores shared with other work, make the HTTP frontend's event threads fall behind.
The host's ``net.core.wmem_default`` (printed) bounds how far behind a thread may fall before
Triton drops responses (docs/operations/response-keeper.md).
``python -m tests.benchmarks.stream_integrity``.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np

from adapters.triton.grpc.stream import Call, Channels, GrpcCall, infer_request
from adapters.triton.http.call import HttpStreams
from adapters.triton.http.wire import generate_body
from adapters.triton.wire import WireTensor
from deploy.sidecar.fleet import sidecar_from_spec
from deploy.sidecar.models import ensure_tiny_model
from deploy.sidecar.spec import parse_spec
from deploy.sidecar.supervisor import Sidecar
from tests.benchmarks.transport_clients import MODEL, PROMPT

OUTPUTS = ["output_ids", "sequence_length"]
CallOpener = Callable[[str], Call]


def _tensors(tokens: int) -> list[WireTensor]:
    arrays = {
        "input_ids": np.array([PROMPT], np.int32),
        "input_lengths": np.array([[len(PROMPT)]], np.int32),
        "request_output_len": np.array([[tokens]], np.int32),
        "streaming": np.array([[True]]),
    }
    return [
        WireTensor(name, "BOOL" if a.dtype == bool else "INT32", a) for name, a in arrays.items()
    ]


async def _one(open_call: CallOpener, request_id: str, tokens: int, timeout_s: float) -> str:
    """One request's outcome: complete, short, stalled or broken."""
    call = open_call(request_id)
    responses = 0
    try:
        async with asyncio.timeout(timeout_s):
            while (replies := await call.read()) is not None:
                for reply in replies:
                    if reply.error:
                        return "broken"
                    responses += bool(reply.outputs.get("output_ids") is not None)
                    if reply.final:
                        return "complete" if responses == tokens else "short"
    except TimeoutError:
        call.cancel()
        return "stalled"
    except Exception:
        call.cancel()
        return "broken"
    finally:
        # Read to its end (a cancellation racing Triton's completion of the call can crash
        # Triton before 24.12); one that does not end soon is cancelled.
        await call.drain(1.0)
    return "complete" if responses == tokens else "short"


async def _run(open_call: CallOpener, streams: int, tokens: int, seconds: float,
               timeout_s: float) -> Counter[str]:  # fmt: skip
    outcomes: Counter[str] = Counter()
    stop_at = time.monotonic() + seconds
    count = 0

    async def client(index: int) -> None:
        nonlocal count
        while time.monotonic() < stop_at:
            count += 1
            outcomes[await _one(open_call, f"s{index}-{count}", tokens, timeout_s)] += 1

    await asyncio.gather(*(client(index) for index in range(streams)))
    return outcomes


async def _transport(name: str, sidecar: Sidecar, args: argparse.Namespace) -> Counter[str]:
    tensors = _tensors(args.tokens)
    deadline_s = args.timeout + 5.0
    if name == "http":
        streams = HttpStreams()

        def open_http(request_id: str) -> Call:
            body = generate_body(request_id, tensors)
            deadline = asyncio.get_running_loop().time() + deadline_s
            return streams.call(sidecar.http_url, MODEL, body, {}, deadline)

        try:
            return await _run(open_http, args.streams, args.tokens, args.seconds, args.timeout)
        finally:
            await streams.close()
    channels = Channels()

    def open_grpc(request_id: str) -> Call:
        message = infer_request(MODEL, request_id, tensors, OUTPUTS)
        return GrpcCall(channels, sidecar.grpc_url, message, deadline_s, {}, OUTPUTS)

    try:
        return await _run(open_grpc, args.streams, args.tokens, args.seconds, args.timeout)
    finally:
        await channels.close()


def _report(name: str, keeper: str, outcomes: Counter[str], args: argparse.Namespace) -> None:
    kinds = ("complete", "short", "stalled", "broken")
    cells = "  ".join(f"{kind} {outcomes[kind]}" for kind in kinds)
    print(
        f"{name:<5} keeper {keeper:<3}  http threads {args.http_threads}  wmem_default "
        f"{_wmem_default()}  streams "
        f"{args.streams}  tokens {args.tokens}  requests {sum(outcomes.values())}  {cells}",
        flush=True,
    )


def _wmem_default() -> str:
    """The host's ``net.core.wmem_default``: the buffer of the socket through which Triton's
    HTTP frontend hands each response to its event thread (a full one drops the response)."""
    try:
        return Path("/proc/sys/net/core/wmem_default").read_text().strip()
    except OSError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--timeout", type=float, default=10.0, help="a stream's end, at most")
    parser.add_argument("--http-threads", type=int, default=1)
    parser.add_argument("--transports", default="http,grpc")
    parser.add_argument(
        "--keeper",
        default="off,on",
        help="tritonserver without the response keeper, with it, or one after the other",
    )
    args = parser.parse_args(argv)
    tokenizer = ensure_tiny_model()
    for keeper in args.keeper.split(","):
        spec = parse_spec(
            {
                "models": [
                    {
                        "name": "lt",
                        "engine": {"kind": "loadtest", "tokenizer_dir": str(tokenizer)},
                        "triton_max_batch_size": 256,
                    }
                ],
                "sidecars": [
                    {
                        "name": "integrity",
                        "extra_args": [f"--http-thread-count={args.http_threads}"],
                        "keep_responses": keeper == "on",
                    }
                ],
            }
        )
        with (
            tempfile.TemporaryDirectory(prefix="stream-integrity-") as scratch,
            sidecar_from_spec(spec, spec.sidecars[0], Path(scratch)) as sidecar,
        ):
            kept = "on" if sidecar.keeps_responses else "off"
            for name in args.transports.split(","):
                _report(name, kept, asyncio.run(_transport(name, sidecar, args)), args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
