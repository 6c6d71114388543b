"""The engines a pipeline's ``tensorrt_llm`` model may run, as a deploy spec names them."""

from __future__ import annotations

from typing import Literal

import msgspec


class TorchEngine(
    msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="torch", tag_field="kind"
):
    """The project's PyTorch engine for the ``tensorrt_llm`` model (Hugging Face causal LMs)."""

    model_dir: str
    """A Hugging Face model directory or hub id (or ``tiny`` / ``smollm2``)."""
    device: str = "auto"
    """Torch device: ``auto`` (CUDA when the machine has it, else the CPU), ``cpu``, ``cuda`` or
    ``cuda:N``."""
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    """Weights and activations dtype; ``auto`` is float32 on CPU and bfloat16 on CUDA."""
    max_batch_size: int = 16
    """Most sequences decoded together by in-flight batching."""
    max_seq_len: int = 4096
    """Most tokens of prompt plus output for one sequence."""
    lora_cache_size: int = 8
    """LoRA adapters the engine keeps (least recently used evicted); a request for an evicted
    one is answered with TensorRT-LLM's "not found in cache" error, and the gateway resends."""
    guided_decoding: bool = True
    """Guided decoding with xgrammar (``guided_decoding_backend: xgrammar``): JSON, JSON schema,
    regex, EBNF and structural-tag guides, which ``response_format`` and tool calls use."""
    guided_decoding_compile_timeout_ms: int | None = None
    """How long a request waits for its grammar to compile before it fails with a 400 (engine
    default 5000); grammars compile beside the decode steps, which never wait for them."""
    guided_decoding_max_compiles: int | None = None
    """Grammars compiled at once (engine default 2); more wait their turn, within the timeout."""
    guided_decoding_cache_mb: int | None = None
    """Compiled grammars kept by content, in MiB (engine default 256)."""
    enable_kv_cache_reuse: bool | None = None
    """Prefix reuse across requests: full KV-cache blocks of earlier prompts and answers stay
    cached, and a prompt prefills only what is not (engine default true, as the C++ backend's)."""
    enable_chunked_context: bool | None = None
    """Prefill long prompts in chunks of at most ``max_num_tokens`` tokens between decode steps
    of the running batch (default false)."""
    kv_cache_free_gpu_mem_fraction: float | None = None
    """On CUDA, the share of the memory left free by the model that the KV cache takes (engine
    default 0.9)."""
    max_tokens_in_paged_kv_cache: int | None = None
    """Tokens the KV cache holds at most; on the CPU its size (default ``max_batch_size`` times
    ``max_seq_len``: every running sequence fits at full length)."""
    tokens_per_block: int = 32
    """Tokens of one KV-cache block, the unit of reuse and of the block metrics."""
    max_num_tokens: int | None = None
    """Most prompt tokens prefilled in one iteration (engine default 8192)."""
    mixed_batching: bool = True
    """Prompt chunks run in the decode step's forward pass, packed with the running rows, as
    TensorRT-LLM's in-flight batching runs context and generation together (where the model's
    attention allows it: checked at load, else a pass per prompt)."""
    max_beam_width: int = 1
    """Widest beam search a request may ask for (``beam_width``); each beam takes a row of
    ``max_batch_size``."""
    kv_transfer_timeout_ms: int | None = None
    """Disaggregated serving: how long a context-only request's KV-cache blocks wait for a
    generation engine to take them before they are freed (engine default 30000)."""

    def problems(self) -> list[str]:
        """What is wrong with these values, each said alone (none when they are sound)."""
        counts = {
            "max_batch_size": self.max_batch_size,
            "tokens_per_block": self.tokens_per_block,
            "max_num_tokens": self.max_num_tokens,
            "max_tokens_in_paged_kv_cache": self.max_tokens_in_paged_kv_cache,
            "max_beam_width": self.max_beam_width,
        }
        found = [
            f"engine {field} must be >= 1"
            for field, value in counts.items()
            if value is not None and value < 1
        ]
        if self.max_beam_width > self.max_batch_size:
            found.append("engine max_beam_width must not exceed max_batch_size")
        fraction = self.kv_cache_free_gpu_mem_fraction
        if fraction is not None and not 0.0 < fraction <= 1.0:
            found.append("engine kv_cache_free_gpu_mem_fraction must be in (0, 1]")
        return found


class TensorRTLLMEngine(
    msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="tensorrtllm", tag_field="kind"
):
    """The real TensorRT-LLM C++ backend (NGC Triton TensorRT-LLM container)."""

    engine_dir: str
    """Directory of the built TensorRT-LLM engine."""
    gpu_device_ids: str | None = None
    """GPUs of this model's executor, e.g. ``0,1``; ``;`` separates instances."""
    participant_ids: str | None = None
    """MPI ranks of the executor when orchestrator spawning is disabled."""
    batching_strategy: Literal["inflight_fused_batching", "inflight_batching", "V1"] = (
        "inflight_fused_batching"
    )
    """TensorRT-LLM ``gpt_model_type``."""
    batch_scheduler_policy: Literal["guaranteed_no_evict", "max_utilization"] = (
        "guaranteed_no_evict"
    )
    """Scheduler policy of the executor."""
    kv_cache_free_gpu_mem_fraction: float | None = None
    """Share of free GPU memory given to the KV cache (backend default 0.9)."""
    max_tokens_in_paged_kv_cache: int | None = None
    """Cap on KV-cache tokens."""
    enable_kv_cache_reuse: bool | None = None
    """Prefix reuse across requests (backend default true)."""
    enable_chunked_context: bool | None = None
    """Chunked prefill (backend default false)."""
    max_beam_width: int = 1
    """Beam width the engine was built for."""
    lora_cache_optimal_adapter_size: int | None = None
    """Optimal LoRA adapter size for cache pages (backend default 8)."""
    lora_cache_max_adapter_size: int | None = None
    """Largest LoRA adapter size (backend default 64)."""
    lora_cache_gpu_memory_fraction: float | None = None
    """GPU memory share of the LoRA cache (backend default 0.05)."""
    lora_cache_host_memory_bytes: int | None = None
    """Host LoRA cache size (backend default 1 GB)."""
    lora_prefetch_dir: str | None = None
    """Directory of ``<task id>/model.lora_*.npy`` loaded at start."""
    parameters: dict[str, str] = {}
    """Any other ``tensorrt_llm`` template placeholder, by name."""


class LoadTestEngine(
    msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="loadtest", tag_field="kind"
):
    """A load-test stand-in for the ``tensorrt_llm`` model, only for benchmarks: no model, made-up
    tokens (meaningless text) on a TensorRT-LLM engine's schedule.

    Unpaced (the default) it answers every request at once, so a benchmark measures the serving
    overhead alone; paced (``token_s``, ``prompt_token_s``) each stream gets tokens at a set
    rate, like an engine on a GPU, while costing the host almost nothing.
    """

    tokenizer_dir: str
    """Tokenizer folder, hub id or built-in name (``tiny``, ``smollm2``) of the pipeline's pre-
    and postprocessing; the load-test model itself never loads it."""
    token_id: int | None = None
    """The token id every output position holds; by default the request's own ``input_ids`` in
    a cycle (never ``end_id``), so the detokenized text is made of real words."""
    token_s: float = 0.0
    """Seconds between two output tokens of a stream (0.0125 is 80 tokens/s); 0: at once."""
    prompt_token_s: float = 0.0
    """Seconds per prompt token before a stream's first token (the prefill)."""
    max_batch_size: int = 4096
    """Streams paced at once per instance; more wait their turn."""
    instances: int = 1
    """Instances of the model (each a Python-backend process) that share the requests."""
    senders: int = 4
    """Threads of each instance that send its responses, a request's all from the same one.
    Each send waits for tritonserver to take the response (a round trip between processes),
    where the C++ backend's sends cost it next to nothing: with one thread, a stream's first
    response waits behind every response due before it."""

    def problems(self) -> list[str]:
        """What is wrong with these values, each said alone (none when they are sound)."""
        found = []
        if (self.token_id or 0) < 0:
            found.append("engine token_id must be >= 0")
        if self.token_s < 0 or self.prompt_token_s < 0:
            found.append("engine token_s and prompt_token_s must be >= 0")
        if min(self.max_batch_size, self.instances, self.senders) < 1:
            found.append("engine max_batch_size, instances and senders must be >= 1")
        return found


EngineSpec = TorchEngine | TensorRTLLMEngine | LoadTestEngine
