"""How far one streamed chat travels through the code: the modules it crosses before its first
byte goes to Triton, and the async generators (and modules) each streamed token passes.

The gateway app runs in this process with Triton's recorded answers replayed, as
``tests.benchmarks.gateway_cpu`` does (a real tritonserver answers the first request of each
kind). One warmed-up streamed chat is then traced with ``sys.setprofile``:

- *before the first send*: every module of ``gateway/`` and ``adapters/`` whose code runs from the
  request's arrival until the backend opens its Triton call, in the order the request first
  enters them (the replay double's own module is left out);
- *per token*: the stack each time the Triton exchange decodes a response, from the ASGI app down:
  the async generator frames on it and the modules of its frames.

``python -m tests.benchmarks.path`` prints both, for the ensemble and the ``tensorrt_llm`` entry.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import logging
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from adapters.triton.replay import ReplayingTritonBackend
from gateway.app import create_app
from gateway.settings import parse_settings
from tests.benchmarks.gateway_cpu import InProcessClient, loadtest_sidecar
from tests.benchmarks.serving import gateway_config, http_body

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gateway", "adapters")
DOUBLE = "adapters.triton.replay"
"""The replayed calls stand in for Triton: not a module a real request crosses."""
SENDS = ("H2Connection.open", "_Wire.write", "StreamWriter.write", "_SelectorTransport.write")
"""The qualified names of the calls that write a request's first bytes towards Triton: a gRPC
``ModelStreamInfer`` stream opened on the HTTP/2 connection, an HTTP ``generate_stream`` request
written on its (replayed or real) connection."""
PER_TOKEN = "on_replies"
"""The exchange's method that decodes Triton's responses into a chunk: called once a token."""
MODELS = ("loadtest", "loadtest-engine")


def module_of(frame: FrameType) -> str | None:
    """The dotted name of the project module ``frame`` runs in (``gateway``/``adapters`` only)."""
    try:
        relative = Path(frame.f_code.co_filename).resolve().relative_to(ROOT)
    except ValueError:
        return None
    if relative.parts[0] not in PACKAGES:
        return None
    name = ".".join(relative.with_suffix("").parts)
    return name.removesuffix(".__init__")


@dataclass
class Trace:
    """What one request's trace saw."""

    before_send: dict[str, None] = field(default_factory=dict)
    """The modules entered before the first send, in the order first entered."""
    sent: bool = False
    generators: Counter[tuple[str, ...]] = field(default_factory=Counter)
    token_modules: Counter[tuple[str, ...]] = field(default_factory=Counter)

    def hook(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        module = module_of(frame)
        if module is None:
            if not self.sent and frame.f_code.co_qualname.endswith(SENDS):
                self.sent = True
            return
        name = frame.f_code.co_name
        if not self.sent:
            if frame.f_code.co_qualname.endswith(SENDS):
                self.sent = True
            elif module != DOUBLE:
                self.before_send.setdefault(module)
        if name == PER_TOKEN:
            self._token(frame)

    def _token(self, frame: FrameType) -> None:
        generators: list[str] = []
        modules: list[str] = []
        current: FrameType | None = frame.f_back
        while current is not None:
            module = module_of(current)
            if module is not None and module != DOUBLE:
                if current.f_code.co_flags & inspect.CO_ASYNC_GENERATOR:
                    generators.append(f"{module}.{current.f_code.co_qualname}")
                if module not in modules:
                    modules.append(module)
            current = current.f_back
        self.generators[tuple(reversed(generators))] += 1
        self.token_modules[tuple(reversed(modules))] += 1


async def traced(client: InProcessClient, model: str, tokens: int) -> Trace:
    """One streamed chat of ``model`` under the profiler."""
    trace = Trace()
    body = http_body("chat", model, True, tokens)
    sys.setprofile(trace.hook)
    try:
        await client.post("/v1/chat/completions", body)
    finally:
        sys.setprofile(None)
    return trace


def report(model: str, trace: Trace) -> str:
    gateway = [m for m in trace.before_send if m.startswith("gateway")]
    adapters = [m for m in trace.before_send if m.startswith("adapters")]
    lines = [
        f"## streamed chat, {model}",
        f"modules before the first send: {len(trace.before_send)} "
        f"({len(gateway)} gateway, {len(adapters)} adapters), in the order first entered",
        *(f"  {m}" for m in trace.before_send),
    ]
    chain, _ = trace.generators.most_common(1)[0] if trace.generators else ((), 0)
    modules, _ = trace.token_modules.most_common(1)[0] if trace.token_modules else ((), 0)
    lines.append(f"async generators a token passes: {len(chain)}")
    lines += [f"  {g}" for g in chain]
    lines.append(f"modules a token passes: {len(modules)}")
    lines += [f"  {m}" for m in modules]
    if not trace.sent:
        lines.append("(the backend's send was not seen: the first-send count is the whole request)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8, help="tokens of the traced chat")
    args = parser.parse_args(argv)
    logging.disable(logging.INFO)
    with loadtest_sidecar("bench-path-") as (sidecar, tokenizer_dir):
        config = gateway_config(sidecar, tokenizer_dir)
        config["models"] = [m for m in config["models"] if m["name"] in MODELS]
        backend = ReplayingTritonBackend()
        client = InProcessClient(create_app(parse_settings(config), backend=backend))

        async def run() -> list[str]:
            inbox, task = await client.lifespan()
            try:
                for model in MODELS:
                    body = http_body("chat", model, True, args.tokens)
                    await client.post("/v1/chat/completions", body)
                backend.replaying = True
                reports = []
                for model in MODELS:
                    for _ in range(20):
                        body = http_body("chat", model, True, args.tokens)
                        await client.post("/v1/chat/completions", body)
                    reports.append(report(model, await traced(client, model, args.tokens)))
                return reports
            finally:
                await inbox.put({"type": "lifespan.shutdown"})
                await task

        reports = asyncio.run(run())
    print("\n\n".join(reports))
    return 0


if __name__ == "__main__":
    sys.exit(main())
