"""A gRPC client of the `tensorrt_llm` model for tests: its inputs, one streamed request, its
tokens."""

from __future__ import annotations

import itertools
import queue
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient

from deploy.sidecar.supervisor import Sidecar

_ids = itertools.count()
MODEL = "tiny_tensorrt_llm"
TIMEOUT_S = 120.0
PROMPT = (634, 619, 510, 592, 20)

TRITON_DTYPES = {
    np.int32: "INT32",
    np.uint8: "UINT8",
    np.uint64: "UINT64",
    np.float32: "FP32",
    np.float16: "FP16",
    np.bool_: "BOOL",
    np.object_: "BYTES",
}


def _inputs(values: dict[str, Any]) -> list[grpcclient.InferInput]:
    tensors = []
    for name, value in values.items():
        array = np.asarray(value)
        tensor = grpcclient.InferInput(name, list(array.shape), TRITON_DTYPES[array.dtype.type])
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    return tensors


class Stream:
    """A gRPC stream carrying one request to the engine model, read response by response."""

    def __init__(
        self,
        server: Sidecar,
        values: dict[str, Any],
        request_id: str | None = None,
        model: str = MODEL,
        parameters: dict[str, str] | None = None,
    ) -> None:
        self.request_id = f"engine-test-{next(_ids)}" if request_id is None else request_id
        self.responses: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self.open = True
        self.client = grpcclient.InferenceServerClient(server.grpc_url)
        self.client.start_stream(callback=lambda result, error: self.responses.put((result, error)))
        self.client.async_stream_infer(
            model,
            _inputs(values),
            request_id=self.request_id,
            enable_empty_final_response=True,
            parameters=parameters,
        )

    @staticmethod
    def _parse(result: Any, error: Any) -> tuple[dict[str, Any], bool]:
        if error is not None:
            raise RuntimeError(str(error))
        response = result.get_response()
        final = response.parameters["triton_final_response"].bool_param
        return {out.name: result.as_numpy(out.name) for out in response.outputs}, final

    def next(self) -> tuple[dict[str, Any], bool]:
        return self._parse(*self.responses.get(timeout=TIMEOUT_S))

    def received(self) -> list[tuple[dict[str, Any], bool]]:
        """The responses that have arrived so far, without waiting for more."""
        responses = []
        while not self.responses.empty():
            responses.append(self._parse(*self.responses.get_nowait()))
        return responses

    def collect(self) -> list[tuple[dict[str, Any], bool]]:
        """Every response up to and including the final one."""
        responses = []
        while True:
            outputs, final = self.next()
            responses.append((outputs, final))
            if final:
                self.close()
                return responses

    def error(self) -> str:
        """The error the request ended with."""
        try:
            while True:
                self.next()
        except RuntimeError as exc:
            self.close()
            return str(exc)

    def close(self, *, cancel: bool = False) -> None:
        self.open = False
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


def stop(server: Sidecar, request_id: str, model: str = MODEL) -> None:
    """Stop the running request ``request_id`` as a stop request does (its stream then ends)."""
    values = {
        "input_ids": np.array([[0]], np.int32),
        "input_lengths": np.array([[0]], np.int32),
        "request_output_len": np.array([[0]], np.int32),
        "stop": np.array([[True]]),
    }
    assert Stream(server, values, request_id=request_id, model=model).collect() == [({}, True)]


def request(max_new: int = 16, prompt: tuple[int, ...] = PROMPT, **extra: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "input_ids": np.array([prompt], np.int32),
        "input_lengths": np.array([[len(prompt)]], np.int32),
        "request_output_len": np.array([[max_new]], np.int32),
    }
    for name, value in extra.items():
        if isinstance(value, bool):
            values[name] = np.array([[value]])
        elif isinstance(value, float):
            values[name] = np.array([[value]], np.float32)
        else:
            values[name] = value if isinstance(value, np.ndarray) else np.array([[value]], np.int32)
    return values


def tokens_of(responses: list[tuple[dict[str, Any], bool]], index: int | None = None) -> list[int]:
    out: list[int] = []
    for outputs, _ in responses:
        if "output_ids" not in outputs:
            continue
        if index is not None and int(outputs["sequence_index"][0, 0]) != index:
            continue
        out.extend(outputs["output_ids"].reshape(-1).tolist())
    return out
