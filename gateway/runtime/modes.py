"""Where the runtime's sidecars come from: supervised by this process (or none, the models'
Tritons running elsewhere), or by the parent of this worker, read from its state file."""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

from deploy.sidecar.fleet import sidecar_from_spec
from deploy.sidecar.spec import Spec
from deploy.sidecar.supervisor import Sidecar
from gateway.catalog.transports import build_keepers
from gateway.runtime.base import Runtime, SidecarAddresses, sidecar_addresses
from gateway.runtime.shared import SidecarView, read_state
from gateway.settings import Settings

logger = logging.getLogger(__name__)
SHARED_POLL_S = 0.2
"""How often a worker reads whether its parent's sidecars are up."""


class SupervisingRuntime(Runtime):
    """A gateway that starts and stops the spec's sidecars itself (none without a spec)."""

    def __init__(self, settings: Settings, **services: Any) -> None:
        # Before the services: the metrics read the sidecars from their start on.
        self._sidecars: list[Sidecar] = []
        self._workdir: Path | None = None
        self._temporary_workdir = False
        super().__init__(settings, **services)

    @property
    def sidecars(self) -> list[Sidecar]:
        return list(self._sidecars)

    @property
    def supervised(self) -> bool:
        return bool(self._sidecars)

    async def _prepare_sidecars(self, spec: Spec) -> SidecarAddresses:
        sidecars = self.settings.sidecars
        if sidecars is not None and sidecars.workdir:
            self._workdir = Path(sidecars.workdir)
        else:
            self._workdir = Path(tempfile.mkdtemp(prefix="triton-gateway-"))
            self._temporary_workdir = True
        keepers = await asyncio.to_thread(build_keepers, self.settings, spec)
        for sidecar_spec in spec.sidecars:
            keeper = keepers[sidecar_spec.name]
            sidecar = await asyncio.to_thread(
                sidecar_from_spec, spec, sidecar_spec, self._workdir, response_keeper=keeper
            )
            self._sidecars.append(sidecar)
        return sidecar_addresses(spec, self._sidecars)

    async def _sidecars_up(self) -> bool:
        for sidecar in self._sidecars:
            try:
                await asyncio.to_thread(sidecar.start)
            except Exception as exc:
                reason = f"sidecar {sidecar.name!r} could not start: {exc}"
                logger.error("%s", reason)
                self.lifecycle.fail(reason)
                return False
        return True

    def _stop_sidecars(self) -> None:
        for sidecar in reversed(self._sidecars):
            sidecar.stop(min(2.0, sidecar.stop_grace_s) if self._hurried else None)
        if self._temporary_workdir and self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)


class WorkerRuntime(Runtime):
    """One of several worker processes: the sidecars are its parent's, read from the state file
    the parent writes (``gateway.runtime.shared``)."""

    def __init__(self, settings: Settings, *, shared_sidecars: Path, **services: Any) -> None:
        self._shared = shared_sidecars
        """The state file of the sidecars the parent supervises."""
        super().__init__(settings, **services)

    @property
    def sidecars(self) -> list[SidecarView]:
        return list(read_state(self._shared).sidecars)

    @property
    def supervised(self) -> bool:
        return True

    async def _prepare_sidecars(self, spec: Spec) -> SidecarAddresses:
        return sidecar_addresses(spec, read_state(self._shared).sidecars)

    async def _sidecars_up(self) -> bool:
        while not read_state(self._shared).ready:
            await asyncio.sleep(SHARED_POLL_S)
        return True

    def _stop_sidecars(self) -> None:
        """The parent stops them."""
