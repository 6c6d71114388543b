"""The GPU benchmark's deployment: random-weight Llama models of fixed shapes built on the
machine (the tokenizer's vocabulary), and the gateway's config serving them from one
tritonserver sidecar, one gateway model per way to Triton (transport and entry model)."""

from __future__ import annotations

import argparse
import socket
from pathlib import Path
from typing import Any

from tests.benchmarks.gpu_clients import gateway_model, gateway_ways

BIG = dict(
    hidden_size=2048,
    intermediate_size=8192,
    num_hidden_layers=16,
    num_attention_heads=32,
    num_key_value_heads=8,
)
SMALL = dict(
    hidden_size=768,
    intermediate_size=2048,
    num_hidden_layers=12,
    num_attention_heads=12,
    num_key_value_heads=4,
)
TOY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
)


def ephemeral_port() -> int:
    """A port the OS hands out (not the tests' sequential range, which the gateway takes)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def build_model(out: Path, tokenizer_dir: Path, shape: dict[str, int], device: str) -> int:
    """A random-weight Llama with the tokenizer's vocabulary; returns its parameter count."""
    import torch
    from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        torch_dtype="bfloat16",
        **shape,
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


def gateway_config(
    models: dict[str, Path], args: argparse.Namespace, grpc_port: int
) -> dict[str, Any]:
    ways = gateway_ways(args.transport, args.entry)
    spec_models = []
    for name, folder in models.items():
        spec_models.append(
            {
                "name": name,
                "release": args.release,
                "engine": {
                    "kind": "torch",
                    "model_dir": str(folder),
                    "device": args.device,
                    "dtype": "bfloat16",
                    "max_batch_size": args.max_batch_size,
                    "max_seq_len": 2048,
                    "guided_decoding": args.guided,
                    "mixed_batching": args.mixed_batching,
                },
                "text_python_env": args.text_env,
                "preprocessing_instances": 4,
                "bls_instances": 1,
            }
        )
    return {
        # One gateway model per way to Triton, all served by the same pipeline.
        "models": [
            {
                "name": gateway_model(name, way, ways),
                "pipeline": name,
                "entry": way.entry,
                "transport": way.transport,
            }
            for name in models
            for way in ways
        ],
        "sidecars": {
            "inline": {
                "models": spec_models,
                "sidecars": [
                    {"name": "gpu", "grpc_port": grpc_port, "metrics_port": args.metrics_port}
                ],
            }
        },
        "server": {"workers": args.workers},
        "tenancy": {"auth": False},
        "limits": {"request_timeout_s": 300, "triton_keep_alive_s": args.triton_keep_alive_s},
    }
