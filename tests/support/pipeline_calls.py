"""Calls of the pipeline models for tests: HTTP generate and generate_stream, and a gRPC stream
of one request."""

from __future__ import annotations

import json
import queue
import urllib.error
import urllib.request
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient

from deploy.sidecar.supervisor import Sidecar

TRITON_DTYPES = {
    np.object_: "BYTES",
    np.int32: "INT32",
    np.uint64: "UINT64",
    np.float32: "FP32",
    np.bool_: "BOOL",
}


def _post(url: str, body: dict[str, Any]) -> tuple[int, str]:
    data = json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def generate(server: Sidecar, model: str, body: dict[str, Any]) -> dict[str, Any]:
    status, text = _post(f"{server.http_url}/v2/models/{model}/generate", body)
    payload: dict[str, Any] = json.loads(text)
    payload["status"] = status
    return payload


def generate_stream(server: Sidecar, model: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    status, text = _post(f"{server.http_url}/v2/models/{model}/generate_stream", body)
    assert status == 200, text
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


def inputs_of(values: dict[str, Any]) -> list[grpcclient.InferInput]:
    tensors = []
    for name, value in values.items():
        array = np.asarray(value)
        if array.dtype.kind in "US":
            array = np.vectorize(lambda s: str(s).encode(), otypes=[np.object_])(array)
        tensor = grpcclient.InferInput(name, list(array.shape), TRITON_DTYPES[array.dtype.type])
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    return tensors


class Stream:
    """One gRPC bidirectional stream carrying a single request, read response by response."""

    def __init__(self, server: Sidecar, model: str, values: dict[str, Any], request_id: str):
        self.responses: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self.client = grpcclient.InferenceServerClient(server.grpc_url)
        self.client.start_stream(callback=lambda result, error: self.responses.put((result, error)))
        self.client.async_stream_infer(
            model, inputs_of(values), request_id=request_id, enable_empty_final_response=True
        )

    def next(self, timeout: float = 60) -> tuple[dict[str, Any], bool]:
        result, error = self.responses.get(timeout=timeout)
        if error is not None:
            raise AssertionError(f"stream error: {error}")
        response = result.get_response()
        final = response.parameters["triton_final_response"].bool_param
        return {out.name: result.as_numpy(out.name) for out in response.outputs}, final

    def collect(self) -> list[dict[str, Any]]:
        chunks = []
        while True:
            outputs, final = self.next()
            if outputs:
                chunks.append(outputs)
            if final:
                self.close()
                return chunks

    def close(self, *, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


def texts(chunks: list[dict[str, Any]]) -> list[str]:
    return [bytes(c["text_output"].reshape(-1)[0]).decode() for c in chunks if "text_output" in c]
