"""LoRA adapters in TensorRT-LLM's layout, a bounded cache of them, and a batched LoRA matmul.

A request names its adapter by ``lora_task_id``; the first request of a task (or the first
after the task was evicted) also carries ``lora_weights`` (one row per module and layer: the
flattened ``A`` matrix ``[r, in]`` then the flattened ``B`` matrix ``[out, r]``, ``B`` already
scaled by alpha/r) and ``lora_config`` (rows ``[module_id, layer_idx, r(, is_dora)]``). The
linear layers of a Llama-style model are wrapped once; each forward pass then adds
``x @ A.T @ B.T`` for every row of the batch with its own adapter, as one batched matmul over
the rows' stacked (rank-padded) matrices, so requests on different adapters and on none share
one decode step.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from deploy.triton.engine.types import EngineError, LoraRequest

MODULES: dict[int, tuple[str, tuple[str, ...]]] = {
    0: ("attn_qkv", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
    1: ("attn_q", ("self_attn.q_proj",)),
    2: ("attn_k", ("self_attn.k_proj",)),
    3: ("attn_v", ("self_attn.v_proj",)),
    4: ("attn_dense", ("self_attn.o_proj",)),
    5: ("mlp_h_to_4h", ("mlp.gate_proj",)),
    6: ("mlp_4h_to_h", ("mlp.down_proj",)),
    7: ("mlp_gate", ("mlp.up_proj",)),
}
"""TensorRT-LLM's LoRA module ids and the Hugging Face linears each one adapts.
``attn_qkv`` is one ``A`` for the fused projection; its ``B`` rows split into q, k and v."""
NOT_CACHED = "LoRA task {task} not found in cache. Please send LoRA weights with request"
EXECUTOR_FAILED = "Executor failed process requestId {request} due to the following error: {error}"
Key = tuple[int, str]
"""(layer index, dotted path of a linear inside the layer)."""


@dataclass(eq=False)
class LoadedLora:
    """One task's matrices on the model's device and in its dtype, by linear layer."""

    task_id: int
    matrices: dict[Key, tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class LoraTargets:
    """What a model offers to adapt: its layer count and each linear's in/out features."""

    layers: int
    shapes: dict[str, tuple[int, int]]
    dtype: torch.dtype
    device: torch.device

    @classmethod
    def of(cls, model: Any, device: torch.device) -> LoraTargets | None:
        """The targets of a Llama-style model, None for other architectures."""
        layers = _decoder_layers(model)
        if not layers:
            return None
        shapes = {}
        for _, paths in MODULES.values():
            for path in paths:
                linear = _submodule(layers[0], path)
                if isinstance(linear, torch.nn.Linear):
                    shapes[path] = (linear.in_features, linear.out_features)
        return cls(len(layers), shapes, next(model.parameters()).dtype, device)

    def adapter(
        self, task_id: int, weights: npt.NDArray[Any], config: npt.NDArray[Any]
    ) -> LoadedLora:
        """Check and load an adapter from its TensorRT-LLM tensors (batch dimension dropped)."""
        if config.ndim != 2 or config.shape[1] not in (3, 4):
            raise EngineError(
                f"Expected lora_config of shape [num_modules_layers, 3 or 4], got {config.shape}"
            )
        if weights.ndim != 2 or weights.shape[0] != config.shape[0]:
            raise EngineError(
                f"Expected lora_weights of shape [{config.shape[0]}, row] to match lora_config, "
                f"got {weights.shape}"
            )
        if not np.issubdtype(weights.dtype, np.floating):
            raise EngineError(f"lora_weights must be floating point, got {weights.dtype}")
        matrices: dict[Key, tuple[torch.Tensor, torch.Tensor]] = {}
        for row, entry in zip(weights, config.astype(np.int64), strict=True):
            for key, pair in self._module(row, [int(v) for v in entry]):
                matrices[key] = pair
        return LoadedLora(task_id, matrices)

    def _module(self, row: npt.NDArray[Any], entry: list[int]) -> list[tuple[Key, Any]]:
        module_id, layer, rank = entry[:3]
        if len(entry) == 4 and entry[3]:
            raise EngineError("DoRA adapters (is_dora = 1) are not supported by the torch engine")
        if module_id not in MODULES:
            raise EngineError(f"lora module id {module_id} is not supported by the torch engine")
        name, paths = MODULES[module_id]
        if any(path not in self.shapes for path in paths):
            raise EngineError(f"lora module {name} not enabled for this model")
        if not 0 <= layer < self.layers:
            raise EngineError(f"Invalid layer_idx {layer}: the model has {self.layers} layers")
        if rank <= 0:
            raise EngineError(f"Invalid low_rank ({rank}). low_rank must be greater than 0")
        fan_in = self.shapes[paths[0]][0]
        outs = [self.shapes[path][1] for path in paths]
        need = rank * fan_in + sum(outs) * rank
        if row.size < need:
            raise EngineError(
                f"lora_weights row of module {name}, layer {layer} holds {row.size} values; "
                f"rank {rank} needs {need}"
            )
        values = torch.from_numpy(np.ascontiguousarray(row[:need]).astype(np.float32))
        values = values.to(device=self.device, dtype=self.dtype)
        a = values[: rank * fan_in].reshape(rank, fan_in)
        b = values[rank * fan_in :].reshape(sum(outs), rank)
        return [
            ((layer, path), (a, part))
            for path, part in zip(paths, torch.split(b, outs), strict=True)
        ]


class LoraCache:
    """The adapters the engine keeps, least recently used evicted first.

    A running request holds its own reference to its adapter, so eviction only means that the
    next request of that task must send the weights again, as with TensorRT-LLM.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self._adapters: OrderedDict[int, LoadedLora] = OrderedDict()
        self._lock = threading.Lock()
        self._executor_ids = itertools.count(1)

    def resolve(self, request: LoraRequest, targets: LoraTargets | None) -> LoadedLora:
        """The request's adapter: loaded from its tensors (and cached), or from the cache."""
        if targets is None:
            raise EngineError("LoRA is not supported by the torch engine for this architecture")
        if request.weights is not None and request.config is not None:
            adapter = targets.adapter(request.task_id, request.weights, request.config)
            with self._lock:
                self._adapters[request.task_id] = adapter
                self._adapters.move_to_end(request.task_id)
                while len(self._adapters) > self.capacity:
                    self._adapters.popitem(last=False)
            return adapter
        with self._lock:
            cached = self._adapters.get(request.task_id)
            if cached is not None:
                self._adapters.move_to_end(request.task_id)
                return cached
            executor_id = next(self._executor_ids)
        raise EngineError(
            EXECUTOR_FAILED.format(
                request=executor_id, error=NOT_CACHED.format(task=request.task_id)
            )
        )


@dataclass
class LoraContext:
    """The adapter of each row of the forward pass being run (None: no LoRA anywhere)."""

    rows: list[LoadedLora | None] | None = None
    _stacks: dict[Key, Any] = field(default_factory=dict)
    _identity: tuple[int, ...] = ()

    def use(self, rows: list[LoadedLora | None] | None) -> None:
        """Set the rows of the next forward pass; stacked matrices are reused while they hold."""
        if rows is not None and all(adapter is None for adapter in rows):
            rows = None
        # Ids are compared while the previous rows still hold their adapters, so an id seen
        # again is the same adapter, never a new one at a freed address.
        identity = tuple(id(adapter) if adapter else 0 for adapter in rows or ())
        if identity != self._identity:
            self._stacks.clear()
            self._identity = identity
        self.rows = rows

    def stack(self, key: Key, like: torch.Tensor) -> Any:
        """The rows with an adapter for ``key`` (None: all rows) and their rank-padded
        ``A.T`` ``[n, in, r]`` and ``B.T`` ``[n, r, out]``; None when no row adapts ``key``."""
        if key in self._stacks:
            return self._stacks[key]
        pairs = [(row, a.matrices.get(key)) for row, a in enumerate(self.rows or ()) if a]
        present = [(row, pair) for row, pair in pairs if pair is not None]
        stacked = None
        if present:
            rank = max(pair[0].shape[0] for _, pair in present)
            a_stack = like.new_zeros(len(present), rank, present[0][1][0].shape[1])
            b_stack = like.new_zeros(len(present), present[0][1][1].shape[0], rank)
            for slot, (_, (a, b)) in enumerate(present):
                a_stack[slot, : a.shape[0]] = a
                b_stack[slot, :, : b.shape[1]] = b
            rows = torch.tensor([row for row, _ in present], device=like.device)
            whole = len(present) == len(self.rows or ())
            stacked = (None if whole else rows, a_stack.transpose(1, 2), b_stack.transpose(1, 2))
        self._stacks[key] = stacked
        return stacked


class LoraLinear(torch.nn.Module):  # type: ignore[misc]
    """A linear layer plus the LoRA delta of each batch row's adapter."""

    def __init__(self, base: torch.nn.Linear, key: Key, context: LoraContext) -> None:
        super().__init__()
        self.base = base
        self.key = key
        self.context = context

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = self.base(x)
        if self.context.rows is None:
            return y
        stacked = self.context.stack(self.key, x)
        if stacked is None:
            return y
        rows, a_t, b_t = stacked
        if rows is None:
            return y + torch.bmm(torch.bmm(x, a_t), b_t)
        delta = torch.bmm(torch.bmm(x.index_select(0, rows), a_t), b_t)
        return y.index_add(0, rows, delta)


def install(model: Any, context: LoraContext) -> None:
    """Wrap every adaptable linear of every decoder layer (once)."""
    paths = {path for _, group in MODULES.values() for path in group}
    for index, layer in enumerate(_decoder_layers(model)):
        for path in paths:
            parent_path, _, name = path.rpartition(".")
            parent = _submodule(layer, parent_path)
            linear = getattr(parent, name, None) if parent is not None else None
            if isinstance(linear, torch.nn.Linear):
                setattr(parent, name, LoraLinear(linear, (index, path), context))


def _decoder_layers(model: Any) -> list[Any]:
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    return list(layers) if layers is not None else []


def _submodule(module: Any, path: str) -> Any:
    for part in path.split(".") if path else ():
        module = getattr(module, part, None)
        if module is None:
            return None
    return module
