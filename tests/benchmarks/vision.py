"""Time to first token and tokens/s of a chat with one image, through the gateway and the tiny
Llava's ensemble on this machine (``python -m tests.benchmarks.vision``): each request has an
image of its own, so none is served from the KV cache."""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import openai

from deploy.sidecar.vision_model import build_tiny_vision_model
from gateway.settings import LimitSettings, ModelSettings, Settings
from gateway.tenancy import TenancySettings
from tests.support.gateway import LiveGateway
from tests.support.vision import PIPELINE, data_url, sample_image, vision_sidecar


def _one(client: openai.OpenAI, seed: int, max_tokens: int) -> tuple[float, float, int]:
    content = [
        {"type": "image_url", "image_url": {"url": data_url(sample_image(1000 + seed))}},
        {"type": "text", "text": "Describe the picture."},
    ]
    start = time.perf_counter()
    first = 0.0
    tokens = 0
    stream = client.chat.completions.create(
        model="vis",
        messages=[{"role": "user", "content": content}],  # type: ignore[list-item]
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content and not first:
            first = time.perf_counter() - start
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    total = time.perf_counter() - start
    return first, total, tokens


def main() -> None:
    """Print the median time to first token and decode rate over ``--requests`` requests."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="vision-bench-") as folder:
        root = Path(folder)
        model_dir = build_tiny_vision_model(root / "model")
        sidecar = vision_sidecar(model_dir, root / "sidecar")
        sidecar.start()
        model = ModelSettings(
            name="vis",
            triton_url=sidecar.grpc_url,
            triton_model=f"{PIPELINE}_ensemble",
            tokenizer_dir=str(model_dir),
        )
        settings = Settings(
            models=(model,), limits=LimitSettings(), tenancy=TenancySettings(auth=False)
        )
        gateway = LiveGateway(settings).start()
        try:
            client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)
            _one(client, -1, 4)
            runs = [_one(client, seed, args.max_tokens) for seed in range(args.requests)]
        finally:
            gateway.stop()
            sidecar.stop()
    ttft = statistics.median(first for first, _, _ in runs)
    rates = [(n - 1) / (total - first) for first, total, n in runs if n > 1 and total > first]
    print(f"requests: {len(runs)}, one 48x40 PNG each (16 image tokens), {args.max_tokens} tokens")
    print(f"time to first token: median {ttft * 1000:.1f} ms")
    print(f"decode: median {statistics.median(rates):.1f} tokens/s per request")


if __name__ == "__main__":
    main()
