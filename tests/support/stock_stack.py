"""One release's stock models in tritonserver with a gateway in front, for the stock tests."""

from __future__ import annotations

import logging
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest

from deploy.sidecar.supervisor import Sidecar
from gateway.settings import AdapterSettings, LimitSettings, ModelSettings, Settings
from gateway.tenancy import TenancySettings
from tests.support.gateway import LiveGateway
from tests.support.prometheus import value
from tests.support.stock import BLS_LOADS, NO_BLS_REASON, NOSEED_ENSEMBLE

LORA_RELEASES = ("v0.19",)
"""Releases whose stock ensemble and BLS carry the LoRA inputs (v0.8 and v0.11's do not)."""
TOKENS_PER_BLOCK = 32
"""The torch engine's default block size: a stock config does not state it."""


class Records(logging.Handler):
    """The warnings a logger emitted."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@dataclass
class Stack:
    """One release's stock models in tritonserver with a gateway in front."""

    release: str
    decoupled: bool
    sidecar: Sidecar
    gateway: LiveGateway
    client: openai.OpenAI
    warnings: Records

    def model(self, entry: str) -> str:
        if entry == "bls" and not BLS_LOADS[self.release]:
            pytest.skip(NO_BLS_REASON)
        return entry

    def triton_model(self, entry: str) -> str:
        """The Triton model behind the gateway's ``entry`` model."""
        return "tensorrt_llm_bls" if self.model(entry) == "bls" else "ensemble"

    def engine_metric(self, family: str, **labels: str) -> float:
        with urllib.request.urlopen(self.sidecar.metrics_url, timeout=10) as response:
            text = response.read().decode()
        return value(text, family, **{"model": "tensorrt_llm", **labels})


def stock_settings(url: str, model_dir: Path, release: str, adapter: Path) -> Settings:
    """The gateway's models over a stock stack: the ensemble, one without a seed, the BLS."""

    def model(name: str, triton_model: str, entry: str) -> ModelSettings:
        lora = (AdapterSettings(name=f"{name}-lora", path=str(adapter)),)
        return ModelSettings(
            name=name,
            triton_url=url,
            triton_model=triton_model,
            entry=entry,  # type: ignore[arg-type]
            tokenizer_dir=str(model_dir),
            adapters=lora if release in LORA_RELEASES and name != "noseed" else (),
            tokens_per_block=TOKENS_PER_BLOCK,
        )

    models = [
        model("ensemble", "ensemble", "ensemble"),
        model("noseed", NOSEED_ENSEMBLE, "ensemble"),
    ]
    if BLS_LOADS[release]:
        models.append(model("bls", "tensorrt_llm_bls", "tensorrt_llm_bls"))
    limits = LimitSettings(request_timeout_s=120.0, shutdown_grace_s=5.0)
    return Settings(models=tuple(models), limits=limits, tenancy=TenancySettings(auth=False))
