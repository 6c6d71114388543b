"""The engine's statistics as Triton custom metrics, named and labelled as the C++ backend's."""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import triton_python_backend_utils as pb_utils

from deploy.triton.engine.types import EngineStats, KvCacheStats

logger = logging.getLogger(__name__)

TOKEN_BUCKETS = [10.0, 50.0, 100.0, 500.0, 1000.0]
_FAMILIES = {
    "nv_trt_llm_request_metrics": ("TRT LLM request metrics", "request_type"),
    "nv_trt_llm_runtime_memory_metrics": ("TRT LLM runtime memory metrics", "memory_type"),
    "nv_trt_llm_kv_cache_block_metrics": ("TRT LLM KV cache block metrics", "kv_cache_block_type"),
    "nv_trt_llm_inflight_batcher_metrics": (
        "TRT LLM inflight_batcher-specific metrics",
        "inflight_batcher_specific_metric",
    ),
    "nv_trt_llm_general_metrics": ("General TRT LLM metrics", "general_type"),
    "nv_trt_llm_disaggregated_serving_metrics": (
        "TRT LLM disaggregated serving metrics",
        "disaggregated_serving_type",
    ),
}


def _rss_bytes() -> int:
    try:
        with open(f"/proc/{os.getpid()}/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def stat_values(
    stats: EngineStats, *, max_batch_size: int, gpu_bytes: int
) -> dict[tuple[str, str], float]:
    """Every gauge value, by (family, label value), from one snapshot of the engine.

    The KV-cache blocks are the engine's pool (``reused`` counts since the start, as the C++
    backend's executor does); an engine without one reports an empty pool.
    """
    kv = stats.kv_cache or KvCacheStats(0, 0, 0, 0)
    active = stats.running_sequences + stats.waiting_requests
    return {
        ("nv_trt_llm_request_metrics", "active"): active,
        ("nv_trt_llm_request_metrics", "max"): max_batch_size,
        ("nv_trt_llm_request_metrics", "scheduled"): stats.running_sequences,
        ("nv_trt_llm_request_metrics", "context"): stats.context_requests,
        ("nv_trt_llm_request_metrics", "waiting"): stats.waiting_requests,
        ("nv_trt_llm_runtime_memory_metrics", "cpu"): _rss_bytes(),
        ("nv_trt_llm_runtime_memory_metrics", "gpu"): gpu_bytes,
        ("nv_trt_llm_runtime_memory_metrics", "pinned"): 0,
        ("nv_trt_llm_kv_cache_block_metrics", "max"): kv.max_blocks,
        ("nv_trt_llm_kv_cache_block_metrics", "free"): kv.free_blocks,
        ("nv_trt_llm_kv_cache_block_metrics", "used"): kv.used_blocks,
        ("nv_trt_llm_kv_cache_block_metrics", "tokens_per"): kv.tokens_per_block,
        ("nv_trt_llm_kv_cache_block_metrics", "reused"): kv.reused,
        ("nv_trt_llm_kv_cache_block_metrics", "fraction"): kv.fraction,
        ("nv_trt_llm_inflight_batcher_metrics", "total_context_tokens"): stats.context_tokens,
        ("nv_trt_llm_inflight_batcher_metrics", "generation_requests"): stats.running_sequences,
        ("nv_trt_llm_inflight_batcher_metrics", "micro_batch_id"): 0,
        ("nv_trt_llm_inflight_batcher_metrics", "paused_requests"): 0,
        ("nv_trt_llm_general_metrics", "iteration_counter"): stats.steps,
        ("nv_trt_llm_general_metrics", "timestamp"): time.time() * 1e6,
        ("nv_trt_llm_disaggregated_serving_metrics", "kv_cache_transfer_ms"): stats.kv_transfer_ms,
        ("nv_trt_llm_disaggregated_serving_metrics", "request_count"): stats.kv_transfers,
    }


class EngineMetrics:
    """Publishes the engine's statistics every `period_s`, and token-length histograms.

    Publishing happens on its own thread: every metric update is an IPC round trip to
    tritonserver, which the engine thread must not wait for.
    """

    def __init__(
        self,
        model: str,
        version: str,
        stats: Callable[[], dict[tuple[str, str], float]],
        period_s: float,
    ) -> None:
        self._stats = stats
        self._period_s = period_s
        self._labels = {"model": model, "version": version}
        self._completed: collections.deque[tuple[int, int]] = collections.deque(maxlen=4096)
        self._stopping = threading.Event()
        self._gauges: dict[tuple[str, str], Any] = {}
        self._histograms: dict[str, Any] = {}
        self._families: list[Any] = []
        self._thread = threading.Thread(target=self._run, name="engine-metrics", daemon=True)

    def start(self) -> EngineMetrics:
        """Register the metric families and start publishing."""
        try:
            self._register()
        except Exception:
            logger.warning("custom metrics are unavailable; the engine runs without them")
            return self
        self._thread.start()
        return self

    def completed(self, input_tokens: int, output_tokens: int) -> None:
        """Record the token lengths of a finished request."""
        self._completed.append((input_tokens, output_tokens))

    def stop(self) -> None:
        """Stop publishing, and let go of the metric families while the stub can still free
        them: left to the interpreter's exit, they crash the stub after its shared memory is
        gone."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._gauges.clear()
        self._histograms.clear()
        self._families.clear()

    def _register(self) -> None:
        for name, (description, label) in _FAMILIES.items():
            family = pb_utils.MetricFamily(
                name=name, description=description, kind=pb_utils.MetricFamily.GAUGE
            )
            self._families.append(family)
            for key in self._stats():
                if key[0] == name:
                    self._gauges[key] = family.Metric(labels={**self._labels, label: key[1]})
        for kind in ("input", "output"):
            family = pb_utils.MetricFamily(
                name=f"nv_llm_{kind}_token_len",
                description="TRT LLM response metrics",
                kind=pb_utils.MetricFamily.HISTOGRAM,
            )
            self._families.append(family)
            labels = {**self._labels, "response_metric_type": f"total_{kind}_tokens"}
            self._histograms[kind] = family.Metric(labels=labels, buckets=TOKEN_BUCKETS)

    def _run(self) -> None:
        while not self._stopping.wait(self._period_s):
            try:
                self._publish()
            except Exception:
                logger.debug("publishing engine metrics failed", exc_info=True)

    def _publish(self) -> None:
        for key, value in self._stats().items():
            gauge = self._gauges.get(key)
            if gauge is not None:
                gauge.set(float(value))
        while self._completed:
            input_tokens, output_tokens = self._completed.popleft()
            self._histograms["input"].observe(float(input_tokens))
            self._histograms["output"].observe(float(output_tokens))
