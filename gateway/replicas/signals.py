"""TensorRT-LLM's load signals, read from a tritonserver's Prometheus text (pure).

The C++ backend (and this project's engine) publish, per ``tensorrt_llm`` model::

    nv_trt_llm_request_metrics{model="...",request_type="waiting",version="1"} 3
    nv_trt_llm_request_metrics{model="...",request_type="scheduled",version="1"} 8
    nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction",model="...",version="1"} 0.4
    nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per",model="...",version="1"} 64

and, serving disaggregated, the handoffs sent or received and their time in all::

    nv_trt_llm_disaggregated_serving_metrics{disaggregated_serving_type="request_count",...} 7
    nv_trt_llm_disaggregated_serving_metrics{disaggregated_serving_type="kv_cache_transfer_ms"...} 4
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_LINE = re.compile(
    r"^(?P<family>nv_trt_llm_request_metrics|nv_trt_llm_kv_cache_block_metrics"
    r"|nv_trt_llm_disaggregated_serving_metrics)"
    r"\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)",
    re.MULTILINE,
)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
_WANTED = {
    ("nv_trt_llm_request_metrics", "request_type", "waiting"): "waiting",
    ("nv_trt_llm_request_metrics", "request_type", "scheduled"): "scheduled",
    ("nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type", "fraction"): "kv_fraction",
    ("nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type", "tokens_per"): "tokens_per",
    (
        "nv_trt_llm_disaggregated_serving_metrics",
        "disaggregated_serving_type",
        "request_count",
    ): "handoffs",
    (
        "nv_trt_llm_disaggregated_serving_metrics",
        "disaggregated_serving_type",
        "kv_cache_transfer_ms",
    ): "transfer_ms",
}
_KINDS = {
    "nv_trt_llm_request_metrics": "request_type",
    "nv_trt_llm_kv_cache_block_metrics": "kv_cache_block_type",
    "nv_trt_llm_disaggregated_serving_metrics": "disaggregated_serving_type",
}
_SUMMED = frozenset({"waiting", "scheduled", "handoffs", "transfer_ms"})


@dataclass(frozen=True, slots=True)
class EngineSignals:
    """What one replica's engine reported: its queue, KV-cache use and KV block size, and
    its KV-cache handoffs (disaggregated serving): how many, and their time in all."""

    waiting: float = 0.0
    scheduled: float = 0.0
    kv_fraction: float = 0.0
    tokens_per_block: int | None = None
    handoffs: float | None = None
    transfer_ms: float | None = None


def parse_signals(text: str, engine_model: str | None) -> EngineSignals | None:
    """The signals of ``engine_model`` (of every TensorRT-LLM model on the server when None);
    None when the server publishes none (an engine without TensorRT-LLM's metrics)."""
    found: dict[str, float] = {}
    for match in _LINE.finditer(text):
        family = match["family"]
        labels = dict(_LABEL.findall(match["labels"]))
        if engine_model is not None and labels.get("model") != engine_model:
            continue
        name = _WANTED.get((family, _KINDS[family], labels.get(_KINDS[family], "")))
        if name is None:
            continue
        try:
            value = float(match["value"])
        except ValueError:
            continue
        # Several models or versions: queues and handoffs add up, the fullest cache counts.
        if name in _SUMMED:
            found[name] = found.get(name, 0.0) + value
        else:
            found[name] = max(found.get(name, value), value)
    if not found:
        return None
    tokens_per = found.get("tokens_per")
    return EngineSignals(
        waiting=found.get("waiting", 0.0),
        scheduled=found.get("scheduled", 0.0),
        kv_fraction=found.get("kv_fraction", 0.0),
        tokens_per_block=int(tokens_per) if tokens_per and tokens_per >= 1 else None,
        handoffs=found.get("handoffs"),
        transfer_ms=found.get("transfer_ms"),
    )
