"""Adapters loaded and unloaded at run time (vLLM's endpoints), shared through Redis.

With the Redis store every worker process and every replica follows one list of run-time
adapters: a load or unload through any of them is written there (a hash of name → folder and
base model, and a version number, changed together in one ``MULTI``/``EXEC``), and each polls
the version every ``refresh_s`` and loads or unloads to match, from its own filesystem.
Adapters from the settings file are not on the list and never touched. With the memory store
the list is this process's alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import msgspec

from gateway.catalog.lora.convert import AdapterError
from gateway.catalog.lora.library import AdapterExists, LoadedAdapter
from gateway.catalog.registry import ModelRegistry
from gateway.tenancy.resp import RespError, RespLink, pairs

logger = logging.getLogger(__name__)

_FAILURES = (RespError, OSError, TimeoutError)


class Entry(msgspec.Struct, frozen=True):
    """A run-time adapter as the list holds it."""

    path: str
    base: str


class AdapterBoard:
    """The run-time adapters of this gateway, and of every one sharing its Redis."""

    def __init__(
        self,
        registry: ModelRegistry,
        link: RespLink | None,
        *,
        prefix: str = "tgw",
        refresh_s: float = 0.25,
        timeout_s: float = 0.25,
    ) -> None:
        self._registry = registry
        self._link = link
        self._refresh_s = refresh_s
        self._timeout_s = timeout_s
        self._list_key = f"{prefix}:{{adapters}}:loaded"
        self._version_key = f"{prefix}:{{adapters}}:version"
        self._version: bytes | None = None
        self._mine: set[str] = set()
        """Adapters this process loaded from the list (or through the API)."""
        self._poller: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Load what the list holds, then keep following it."""
        if self._link is None:
            return
        with contextlib.suppress(*_FAILURES):
            await self.sync()
        self._poller = asyncio.get_running_loop().create_task(self._poll())

    async def close(self) -> None:
        """Stop following the list."""
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller

    async def load(self, name: str, path: str, base: str) -> LoadedAdapter:
        """Load here (a bad folder or a taken name fails now), then put it on the list."""
        loaded = await self._load_here(name, path, base)
        if self._link is not None:
            async with asyncio.timeout(self._timeout_s * 4):
                await self._link.transaction(
                    ("HSET", self._list_key, name, msgspec.json.encode(Entry(path, base))),
                    ("INCR", self._version_key),
                )
        return loaded

    async def unload(self, name: str) -> bool:
        """Stop serving ``name`` here and take it off the list; False if neither had it."""
        here = self._registry.adapters.unload(name)
        self._mine.discard(name)
        listed = False
        if self._link is not None:
            async with asyncio.timeout(self._timeout_s * 4):
                removed, _ = await self._link.transaction(
                    ("HDEL", self._list_key, name), ("INCR", self._version_key)
                )
            listed = bool(removed)
        return here or listed

    async def sync(self) -> None:
        """Load and unload to match the list, when its version changed."""
        if self._link is None:
            return
        async with asyncio.timeout(self._timeout_s * 4):
            version = await self._link.call("GET", self._version_key)
            if version == self._version:
                return
            raw = pairs(await self._link.call("HGETALL", self._list_key))
        wanted = {
            name.decode(): msgspec.json.decode(value, type=Entry) for name, value in raw.items()
        }
        for name in self._mine - wanted.keys():
            self._registry.adapters.unload(name)
            self._mine.discard(name)
            logger.info("LoRA adapter %s unloaded (run-time list)", name)
        for name, entry in wanted.items():
            if name in self._mine:
                continue
            try:
                await self._load_here(name, entry.path, entry.base)
            except (AdapterError, AdapterExists, LookupError) as exc:
                logger.warning("run-time LoRA adapter %s not served here: %s", name, exc)
        self._version = version

    async def _load_here(self, name: str, path: str, base: str) -> LoadedAdapter:
        model = self._registry.base_model(base)
        if model is None:
            raise LookupError(f"no base model called {base!r}")
        loaded = await self._registry.adapters.load(
            name, path, model.name, model.route.tokenizer_dir
        )
        self._mine.add(name)
        return loaded

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self._refresh_s)
            try:
                await self.sync()
            except _FAILURES as exc:
                logger.debug("reading the run-time LoRA adapters from redis failed: %s", exc)
