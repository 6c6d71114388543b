"""Reading the string parameters of a Triton model config, shared by every Python model."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

TRUE_WORDS = frozenset({"true", "1", "t", "y", "yes", "on"})
FALSE_WORDS = frozenset({"false", "0", "f", "n", "no", "off"})


def parameter(model_config: Mapping[str, Any], key: str) -> str | None:
    """A parameter's string value; None when missing, empty or still a ``${...}`` placeholder."""
    entry = model_config.get("parameters", {}).get(key)
    if not entry:
        return None
    value = str(entry.get("string_value", "")).strip()
    if not value or (value.startswith("${") and value.endswith("}")):
        return None
    return value


def flag(value: str | None, *, default: bool, name: str = "parameter") -> bool:
    """A boolean parameter (true/false, 1/0, yes/no, on/off); anything else is an error."""
    if value is None:
        return default
    lowered = value.lower()
    if lowered in TRUE_WORDS:
        return True
    if lowered in FALSE_WORDS:
        return False
    raise ValueError(f"parameter {name} must be true or false, got {value!r}")


# The server's own gRPC address, which our sidecars give the models they start (the BLS streams
# its engine calls through it).
GRPC_URL_ENV = "TRITON_GATEWAY_GRPC_URL"


def local_grpc_url(host: str, port: int) -> str:
    """The address a model inside a server listening on ``host``:``port`` reaches it by."""
    if host in ("", "0.0.0.0", "::", "[::]"):
        host = "127.0.0.1"
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
