"""Checks made before anything starts: a configuration that cannot work ends in one line that
names the field and what to do, instead of a traceback from deep inside the start-up."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

from deploy.sidecar.spec import (
    LoadTestEngine,
    Spec,
    TensorRTLLMEngine,
    TorchEngine,
    looks_like_path,
)
from gateway.catalog.disaggregation import check_sidecar_pools
from gateway.settings import Settings, SettingsError

BUILT_IN = "a Hugging Face folder, a hub id or a built-in name (tiny, tiny-vision, smollm2)"


def check_before_start(settings: Settings, spec: Spec | None) -> None:
    """Raise ``SettingsError`` naming the first field that cannot work as it stands; ``spec`` is
    the deploy spec of the sidecars as ``serve`` read it (``gateway.runtime.spec``)."""
    _check_listening(settings)
    _check_store_file(settings)
    if spec is not None:
        for field, folder, what in _spec_folders(spec):
            _check_folder(f"deploy spec: {field}", folder, what)
        check_sidecar_pools(settings.models, spec)
    for model in settings.models:
        if model.tokenizer_dir is not None and looks_like_path(model.tokenizer_dir):
            _check_folder(f"models {model.name!r}: tokenizer_dir", model.tokenizer_dir, BUILT_IN)
        if model.chat_template is not None and not Path(model.chat_template).is_file():
            raise SettingsError(
                f"models {model.name!r}: chat_template {model.chat_template} is not a file: "
                "give a Jinja template file, or leave it out to use the tokenizer's template"
            )
        for adapter in model.adapters:
            _check_folder(
                f"models {model.name!r}: adapters {adapter.name!r}: path",
                adapter.path,
                "a PEFT or TensorRT-LLM LoRA folder",
            )


def _check_store_file(settings: Settings) -> None:
    store = settings.tenancy.store
    if store.kind != "embedded" or store.path is None:
        return
    folder = Path(store.path).parent
    probe = folder if folder.is_dir() else next((p for p in folder.parents if p.is_dir()), folder)
    if not os.access(probe, os.W_OK | os.X_OK):
        raise SettingsError(
            f"tenancy.store.path: the folder {folder} cannot be written, so the admin API's "
            "changes could not be kept: give a path in a writable folder (tenancy.store.path)"
        )


def _spec_folders(spec: Spec) -> Iterator[tuple[str, str, str]]:
    """Each local folder the spec names: its field, the folder, and what belongs there."""
    for model in spec.models:
        where = f"model {model.name!r}"
        engine = model.engine
        if isinstance(engine, TorchEngine):
            yield f"{where}: engine.model_dir", engine.model_dir, BUILT_IN
        elif isinstance(engine, LoadTestEngine):
            yield f"{where}: engine.tokenizer_dir", engine.tokenizer_dir, BUILT_IN
        elif isinstance(engine, TensorRTLLMEngine):
            yield f"{where}: engine.engine_dir", engine.engine_dir, "a built TensorRT-LLM engine"
        if model.tokenizer_dir is not None:
            yield f"{where}: tokenizer_dir", model.tokenizer_dir, BUILT_IN
        if model.vision_model is not None:
            yield f"{where}: vision_model", model.vision_model, "a Llava-style checkpoint folder"


def _check_folder(field: str, folder: str, what: str) -> None:
    if not looks_like_path(folder):
        return
    path = Path(folder).expanduser()
    if not path.exists():
        raise SettingsError(f"{field}: {path} does not exist: give {what}")
    if not path.is_dir():
        raise SettingsError(f"{field}: {path} is not a folder: give {what}")
    if not any(path.iterdir()):
        raise SettingsError(f"{field}: the folder {path} is empty: give {what}")


def _check_listening(settings: Settings) -> None:
    server = settings.server
    _check_port("server.port", server.host, server.port)
    metrics = settings.observability.metrics
    if metrics.port is not None:
        _check_port("observability.metrics.port", metrics.host or server.host, metrics.port)


def _check_port(field: str, host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as exc:
        raise SettingsError(
            f"{field}: cannot listen on {host}:{port} ({exc.strerror}): stop what holds the "
            f"port, or give another one (--port, or {field} in the settings)"
        ) from exc
