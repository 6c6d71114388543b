"""The LoRA adapters the gateway serves, by name, each on one base model.

An adapter's task id is derived from its content (weights and config), so every replica and
every restart sends the same id for the same adapter and TensorRT-LLM's LoRA cache stays
valid across them. Loading reads and converts files in a worker thread.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import numpy as np

from adapters.contract import LoraAdapter
from gateway.catalog.lora.convert import AdapterError, BaseShapes, TrtLora, load_adapter

logger = logging.getLogger(__name__)
TASK_ID_BITS = 63
"""Task ids stay below 2**63: TensorRT-LLM's id type is uint64, and int64 readers stay safe."""


class AdapterExists(ValueError):
    """An adapter of that name is already loaded."""


@dataclass(frozen=True)
class LoadedAdapter:
    """One adapter ready to route: its name, base model, source folder and wire tensors."""

    name: str
    base: str
    path: str
    adapter: LoraAdapter
    created: int


def task_id(lora: TrtLora) -> int:
    """A stable id from the adapter's content."""
    digest = hashlib.sha256()
    for array in (lora.config.astype(np.int32), lora.weights.astype(np.float32)):
        digest.update(str(array.shape).encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return int.from_bytes(digest.digest()[:8], "big") >> (64 - TASK_ID_BITS)


class LoraLibrary:
    """Adapters by name; ``base:adapter`` names also resolve."""

    def __init__(self) -> None:
        self._adapters: dict[str, LoadedAdapter] = {}

    def __iter__(self) -> Iterator[LoadedAdapter]:
        return iter(list(self._adapters.values()))

    def find(self, name: str) -> LoadedAdapter | None:
        """The adapter a request's ``model`` names, if it names one."""
        found = self._adapters.get(name)
        if found is None and ":" in name:
            base, _, adapter = name.partition(":")
            found = self._adapters.get(adapter)
            if found is not None and found.base != base:
                return None
        return found

    async def load(self, name: str, path: str, base: str, base_dir: str | None) -> LoadedAdapter:
        """Read, convert and check an adapter folder, then serve it as ``name``."""
        if not name or ":" in name:
            raise AdapterError(f"adapter name {name!r} must be non-empty and without ':'")
        if name in self._adapters:
            raise AdapterExists(f"LoRA adapter '{name}' is already loaded")
        shapes = BaseShapes.read(base_dir) if base_dir else None
        lora = await anyio.to_thread.run_sync(load_adapter, Path(path), shapes)
        if name in self._adapters:
            raise AdapterExists(f"LoRA adapter '{name}' is already loaded")
        loaded = LoadedAdapter(
            name=name,
            base=base,
            path=str(path),
            adapter=LoraAdapter(name, task_id(lora), lora.weights, lora.config),
            created=int(time.time()),
        )
        self._adapters[name] = loaded
        logger.info(
            "LoRA adapter %s on %s: %d modules, task id %d",
            name,
            base,
            lora.config.shape[0],
            loaded.adapter.task_id,
        )
        return loaded

    def unload(self, name: str) -> bool:
        """Stop serving ``name``; False if it was not loaded."""
        return self._adapters.pop(name, None) is not None
