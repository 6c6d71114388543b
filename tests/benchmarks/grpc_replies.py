"""What reading one streamed token's response costs the backend, per transport and entry.

One token's response as Triton sends it (its parameters included: the sequence flags, the
final flag), for the ``ensemble`` entry (text, input and output token counts) and for the
``tensorrt_llm`` entry (an id and the sequence length), read and decoded as the backend does:

- ``grpc, index kept``: one call's ``ReplyReader`` reading its responses, the outputs found
  where the previous response had them (``adapters/triton/grpc/replies.py``);
- ``grpc, outputs walked``: a reader per response, so every response's output tensors are walked
  to find the wanted ones (the cost of each call's first response);
- ``http``: the same outputs as one event of Triton's HTTP ``generate_stream``.

CPU µs per response, the best of ``--repeat`` timings: ``python -m tests.benchmarks.grpc_replies``.
"""

from __future__ import annotations

import argparse
import timeit
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
from tritonclient.grpc import service_pb2

from adapters.triton.grpc.replies import ReplyReader
from adapters.triton.http.wire import reply_of
from adapters.triton.responses import EngineDecoder, ResponseDecoder

Output = tuple[str, str, tuple[int, ...], bytes, Any]
"""Name, datatype, shape, raw contents, and the value Triton's JSON gives."""

ENSEMBLE: list[Output] = [
    ("num_input_tokens", "INT32", (1, 1), (41).to_bytes(4, "little"), 41),
    ("text_output", "BYTES", (1, 1), (4).to_bytes(4, "little") + b" fox", " fox"),
    ("num_output_tokens", "INT32", (1, 1), (1).to_bytes(4, "little"), 1),
]
ENGINE: list[Output] = [
    ("output_ids", "INT32", (1, 1, 1), (1234).to_bytes(4, "little"), [1234]),
    ("sequence_length", "INT32", (1, 1), (1).to_bytes(4, "little"), 1),
]


def grpc_message(model: str, outputs: Sequence[Output]) -> bytes:
    """A ``ModelStreamInferResponse`` as Triton streams one token."""
    response = service_pb2.ModelStreamInferResponse()
    infer = response.infer_response
    infer.model_name, infer.model_version, infer.id = model, "1", "gen520f8e5a-0"
    for name in ("sequence_start", "sequence_end", "triton_final_response"):
        infer.parameters[name].bool_param = False
    infer.parameters["sequence_id"].int64_param = 0
    for name, datatype, shape, raw, _ in outputs:
        tensor = infer.outputs.add()
        tensor.name, tensor.datatype = name, datatype
        tensor.shape.extend(shape)
        infer.raw_output_contents.append(raw)
    return bytes(response.SerializeToString())


def http_event(model: str, outputs: Sequence[Output]) -> bytes:
    """The same token as one ``generate_stream`` event."""
    body: dict[str, Any] = {"model_name": model, "model_version": "1"}
    body.update({name: value for name, _, _, _, value in outputs})
    return msgspec.json.encode(body)


class _Ids:
    """Ids to text, as the gateway's tokenizer's stream would (without its cost)."""

    def step(self, ids: list[int]) -> str:
        return " fox"

    def flush(self) -> str:
        return ""


def cases(model: str, outputs: Sequence[Output]) -> dict[str, Callable[[], object]]:
    """Each way of reading the token: the reply alone, and the reply decoded into a chunk."""
    names = [name for name, *_ in outputs]
    message, event = grpc_message(model, outputs), http_event(model, outputs)
    kept = ReplyReader(names)
    kept.read(message)

    def decoder() -> ResponseDecoder | EngineDecoder:
        if model == "tensorrt_llm":
            return EngineDecoder(_Ids(), prompt_tokens=41)  # type: ignore[arg-type]
        return ResponseDecoder()

    decoding = decoder()
    return {
        "grpc, index kept": lambda: kept.read(message),
        "grpc, outputs walked": lambda: ReplyReader(names).read(message),
        "http": lambda: reply_of(event),
        "grpc, index kept, decoded": lambda: decoding.decode(kept.read(message).outputs),
        "http, decoded": lambda: decoding.decode(reply_of(event).outputs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=100_000, help="reads a timing")
    parser.add_argument("--repeat", type=int, default=5, help="timings; the best is shown")
    args = parser.parse_args()
    print(f"{'entry':13} {'read':28} {'µs/response':>11}")
    for model, outputs in (("ensemble", ENSEMBLE), ("tensorrt_llm", ENGINE)):
        for name, read in cases(model, outputs).items():
            best = min(timeit.repeat(read, number=args.number, repeat=args.repeat))
            print(f"{model:13} {name:28} {best / args.number * 1e6:11.2f}", flush=True)


if __name__ == "__main__":
    main()
