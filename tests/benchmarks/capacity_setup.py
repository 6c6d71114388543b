"""What the capacity benchmark and its first-token probe run against: the paced engine's
sidecar, the gateway's configuration for it, the prompt and its templated chat ids, the direct
gRPC request."""

from __future__ import annotations

import argparse
import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from adapters.triton.grpc.stream import infer_request
from adapters.triton.wire import WireTensor
from deploy.sidecar.fleet import sidecar_from_spec
from deploy.sidecar.spec import parse_spec
from deploy.sidecar.supervisor import Sidecar
from gateway.catalog.text.prompts import PromptTokenizer
from gateway.tenancy.service import digest

KEY = "tgw-capacity-0123456789abcdef0123456789abcdef"
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
ENGINE_MODEL = "lt_tensorrt_llm"
"""The paced engine as Triton serves it: model ``lt``'s ``tensorrt_llm``."""


def start_triton(
    args: argparse.Namespace, tokenizer: Path, workdir: Path, token_id: int
) -> Sidecar:
    """The paced engine answering ``token_id`` throughout: a word, so that every token is text
    for every endpoint (the prompt's own ids would echo a chat template's special tokens, which
    a chat stream rightly shows as nothing, a gap the direct path does not count)."""
    engine = {
        "kind": "loadtest",
        "token_id": token_id,
        "tokenizer_dir": str(tokenizer),
        "token_s": 1.0 / args.rate,
        "prompt_token_s": args.prompt_token_s,
        "instances": args.instances,
        "senders": args.senders,
    }
    model = {"name": "lt", "release": "latest", "engine": engine, "triton_max_batch_size": 256}
    if args.text_env:
        model["text_python_env"] = args.text_env
    spec = parse_spec({"models": [model], "sidecars": [{"name": "capacity"}]})
    sidecar = sidecar_from_spec(spec, spec.sidecars[0], workdir)
    sidecar.start()
    return sidecar


def gateway_config(
    sidecar: Sidecar,
    tokenizer: Path,
    workers: int,
    *,
    send_ahead: bool = True,
    transport: str = "grpc",
    before_transports: bool = False,
    before_embedded: bool = False,
) -> dict[str, Any]:
    """The gateway's settings; ``before_transports`` for a checkout that knows no
    ``transport`` setting (``--baseline``), where an HTTP address alone meant HTTP;
    ``before_embedded`` for one that knows no ``embedded`` store, where ``memory`` with several
    workers ran the embedded Redis."""
    model: dict[str, Any] = {
        "name": "lt",
        "triton_url": sidecar.grpc_url,
        "triton_model": ENGINE_MODEL,
        "entry": "tensorrt_llm",
        "tokenizer_dir": str(tokenizer),
        "context_length": 4096,
    }
    if not before_transports:
        model["transport"] = transport
    if transport == "http":
        model["triton_http_url"] = sidecar.http_url
    tenant = {"name": "bench", "requests_per_minute": 10_000_000, "tokens_per_minute": 10**12}
    return {
        "models": [model],
        "tenancy": {
            "tenants": [tenant],
            "keys": [{"tenant": "bench", "sha256": digest(KEY)}],
            # Several workers share their limits in the embedded store, kept in no file.
            "store": {
                "kind": "memory" if workers == 1 or before_embedded else "embedded",
                "send_ahead": send_ahead,
            },
        },
        "server": {"workers": workers},
        "limits": {"request_timeout_s": 600},
        "log_level": "WARNING",
    }


def chat_ids(vocabulary: Any) -> list[int]:
    """The prompt's ids as the gateway sends a chat of it: templated and tokenized by the
    gateway's own prompt tokenizer."""
    with ThreadPoolExecutor(1) as executor:
        prompts = PromptTokenizer(vocabulary, executor)
        prompt = asyncio.run(prompts.chat_prompt([{"role": "user", "content": PROMPT}]))
    return list(prompt.ids)


def direct_grpc_job(ids: list[int], tokens: int) -> dict[str, Any]:
    """A load process's job against Triton's gRPC ``ModelStreamInfer``: the engine request of
    the direct HTTP one (the same prompt ids, ``tokens`` streamed), as one prebuilt message."""
    arrays = {
        "input_ids": np.array([ids], np.int32),
        "input_lengths": np.array([[len(ids)]], np.int32),
        "request_output_len": np.array([[tokens]], np.int32),
        "streaming": np.array([[True]]),
    }
    tensors = [
        WireTensor(name, "BOOL" if array.dtype == bool else "INT32", array)
        for name, array in arrays.items()
    ]
    request = infer_request(ENGINE_MODEL, "capacity", tensors, ["output_ids", "sequence_length"])
    return {"grpc": True, "message": request.SerializeToString()}
