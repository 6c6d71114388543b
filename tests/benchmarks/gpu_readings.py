"""What the GPU benchmark reads beside its own timings: the engine's decode steps and Triton's
per-model counters (Triton's metrics port), the gateway's own time to first token (its
``/metrics``), and the machine with its GPU memory."""

from __future__ import annotations

import os
import re
import subprocess
from typing import Any

import httpx


async def engine_steps(http: httpx.AsyncClient, metrics_url: str, model: str) -> int:
    """The decode steps ``model``'s engine has run (its ``iteration_counter`` on Triton's
    metrics); 0 where the sidecar does not report it."""
    try:
        text = (await http.get(metrics_url)).text
    except httpx.HTTPError:
        return 0
    label = f'model="{model}_tensorrt_llm"'
    for line in text.splitlines():
        name = line.startswith("nv_trt_llm_general_metrics{") and "iteration_counter" in line
        if name and label in line:
            return int(float(line.rsplit(" ", 1)[1]))
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


async def triton_counters(http: httpx.AsyncClient, metrics_url: str) -> dict[str, float]:
    """Triton's per-model counters (queue and compute time, requests), by ``name{model}``."""
    try:
        text = (await http.get(metrics_url)).text
    except httpx.HTTPError:
        return {}
    counters = {}
    for line in text.splitlines():
        name = line.split("{", 1)[0]
        if name in _COUNTERS:
            model = re.search(r'model="([^"]+)"', line)
            key = f"{name}{{{model.group(1) if model else ''}}}"
            counters[key] = float(line.rsplit(" ", 1)[1])
    return counters


async def served_ttft(http: httpx.AsyncClient, url: str, model: str) -> dict[float, float]:
    """The gateway's time-to-first-token histogram of ``model``: cumulative counts by bucket."""
    try:
        text = (await http.get(f"{url}/metrics")).text
    except httpx.HTTPError:
        return {}
    buckets: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith("gateway_time_to_first_token_seconds_bucket{") and (
            f'model="{model}"' in line
        ):
            bound = re.search(r'le="([^"]+)"', line)
            if bound is not None:
                key = float(bound.group(1))
                buckets[key] = buckets.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
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
