"""What the GPU benchmark reads beside its own timings: the engine's decode steps and Triton's
per-model counters (Triton's metrics port), the gateway's own time to first token (its
``/metrics``), each read from one scrape of the metrics, and the machine with its GPU memory."""

from __future__ import annotations

import os
import subprocess
from typing import Any

import httpx

from tests.support.prometheus import Sample, parse


async def scrape(http: httpx.AsyncClient, url: str) -> list[Sample]:
    """Every sample of the metrics at ``url``; none where they cannot be read."""
    try:
        text = (await http.get(url)).text
    except httpx.HTTPError:
        return []
    return parse(text)


def engine_steps(triton: list[Sample], model: str) -> int:
    """The decode steps ``model``'s engine has run (its ``iteration_counter`` in Triton's
    metrics); 0 where the sidecar does not report it."""
    for name, labels, value in triton:
        if (
            name == "nv_trt_llm_general_metrics"
            and labels.get("general_type") == "iteration_counter"
            and labels.get("model") == f"{model}_tensorrt_llm"
        ):
            return int(value)
    return 0


_COUNTERS = (
    "nv_inference_request_success",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
    "nv_inference_request_duration_us",
    "nv_inference_exec_count",
)


def triton_counters(triton: list[Sample]) -> dict[str, float]:
    """Triton's per-model counters (queue and compute time, requests), by ``name{model}``."""
    return {
        f"{name}{{{labels.get('model', '')}}}": value
        for name, labels, value in triton
        if name in _COUNTERS
    }


def served_ttft(gateway: list[Sample], model: str) -> dict[float, float]:
    """The gateway's time-to-first-token histogram of ``model``: cumulative counts by bucket."""
    buckets: dict[float, float] = {}
    for name, labels, value in gateway:
        if name == "gateway_time_to_first_token_seconds_bucket" and labels.get("model") == model:
            bound = float(labels["le"])
            buckets[bound] = buckets.get(bound, 0.0) + value
    return buckets


def machine() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"torch": torch.__version__, "cpus": os.cpu_count()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["cuda"] = torch.version.cuda
    try:
        smi = [
            "nvidia-smi",
            "--query-gpu=name,driver_version,memory.total",
            "--format=csv,noheader",
        ]
        info["nvidia_smi"] = subprocess.run(smi, capture_output=True, text=True).stdout.strip()
    except OSError:
        pass
    return info


def gpu_memory() -> str:
    query = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader"]
    try:
        return subprocess.run(query, capture_output=True, text=True).stdout.strip()
    except OSError:
        return "n/a"
