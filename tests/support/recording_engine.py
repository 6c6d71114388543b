"""A ``tensorrt_llm`` stand-in for tests: the load-test engine, writing down what reached it.

Copied as ``model.py`` into a repository's ``tensorrt_llm/1/`` (the Python backend imports it
from there). Each request's numeric and boolean inputs are appended as one JSON line to
``received.jsonl`` in the model's folder before the load-test engine answers, so a test can see
which of the entry model's inputs arrived at the engine and with what value.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from deploy.triton.engine.triton_model import TritonPythonModel as EngineModel

RECORD = "received.jsonl"


def _value(tensor: Any) -> Any:
    array = np.asarray(tensor.as_numpy())
    if array.dtype == np.object_:
        return [item.decode(errors="replace") for item in array.reshape(-1)]
    return array.tolist()


class TritonPythonModel(EngineModel):
    """The load-test engine, whatever engine the config names, recording every request's
    inputs."""

    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        config.setdefault("parameters", {})["load_test_model"] = {"string_value": "true"}
        super().initialize({**args, "model_config": json.dumps(config)})
        self._record = Path(args["model_repository"]) / RECORD

    def execute(self, requests: list[Any]) -> None:
        with self._record.open("a") as out:
            for request in requests:
                inputs = {tensor.name(): _value(tensor) for tensor in request.inputs()}
                out.write(json.dumps({"id": request.request_id(), "inputs": inputs}) + "\n")
        super().execute(requests)
