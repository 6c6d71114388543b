"""The ``triton-gateway`` command: serve a configuration, run the zero-config demo, deploy."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from gateway.replicas.settings import DisaggregationSettings, RoutingSettings
from gateway.settings import (
    ModelSettings,
    SamplingDefaults,
    ServerSettings,
    Settings,
    SettingsError,
    SidecarSettings,
    check_settings,
    load_settings,
)
from gateway.tenancy import TenancySettings
from gateway.tenancy.config import resolve_store
from gateway.tenancy.service import digest, new_key

if TYPE_CHECKING:
    from deploy.sidecar.spec import Spec

logger = logging.getLogger(__name__)
DEMO_MODEL = "smollm2"
DEMO_SPLIT_TOKENS = 32
"""``demo --disaggregated``: shorter prompts run whole on the generation sidecar."""
_ENGINE_ONLY = ["--model-control-mode=explicit", f"--load-model={DEMO_MODEL}_tensorrt_llm"]
DEMO_SPLIT_SIDECARS = [
    {
        "name": "context",
        "disaggregation": {"phase": "context", "kv_transfer_timeout_ms": 30000},
        "extra_args": _ENGINE_ONLY,
    },
    {"name": "generation", "disaggregation": {"phase": "generation"}, "extra_args": _ENGINE_ONLY},
]
"""``demo --disaggregated``: a context and a generation sidecar on the CPU, each loading only
the engine model (the gateway tokenizes)."""


def demo_settings(host: str, port: int, *, disaggregated: bool = False) -> Settings:
    """SmolLM2-135M-Instruct on the PyTorch engine in a local sidecar, served as ``smollm2``;
    ``disaggregated``: in two sidecars, prompts of ``DEMO_SPLIT_TOKENS`` or more prefilled on
    the context sidecar and decoded on the generation sidecar."""
    from deploy.sidecar.models import ensure_smollm2

    model_dir = ensure_smollm2()
    spec: dict[str, object] = {
        "models": [
            {
                "name": DEMO_MODEL,
                "release": "latest",
                "engine": {
                    "kind": "torch",
                    "model_dir": str(model_dir),
                    "max_seq_len": 2048,
                    "enable_kv_cache_reuse": True,
                    "max_beam_width": 4,
                },
            }
        ]
    }
    # A 135M model rambles at temperature 1 and can loop on a phrase; the sampling its model card
    # suggests plus a mild repetition penalty keeps the demo's answers on topic.
    defaults = SamplingDefaults(temperature=0.2, top_p=0.9, repetition_penalty=1.1)
    model = ModelSettings(name=DEMO_MODEL, pipeline=DEMO_MODEL, defaults=defaults)
    if disaggregated:
        spec["sidecars"] = DEMO_SPLIT_SIDECARS
        split = DisaggregationSettings(min_prompt_tokens=DEMO_SPLIT_TOKENS)
        # The gateway tokenizes: the split runs on the engine model itself.
        model = msgspec.structs.replace(
            model, entry="tensorrt_llm", routing=RoutingSettings(disaggregation=split)
        )
    return Settings(
        models=(model,),
        sidecars=SidecarSettings(inline=spec),
        server=ServerSettings(host=host, port=port),
        tenancy=TenancySettings(auth=False),
    )


def serve(settings: Settings, settings_dir: Path | None = None) -> int:
    """Run the gateway until SIGTERM or Ctrl-C drains it; sidecars stop with it. With
    ``server.workers`` above one, a parent process supervises that many workers.

    ``settings_dir`` is the folder of the settings file served, where ``tenancy.store.kind:
    auto`` keeps the embedded store's file."""
    from gateway.observability import configure_logging
    from gateway.ops.preflight import check_before_start
    from gateway.runtime.spec import parse_sidecar_spec

    tenancy = resolve_store(
        settings.tenancy, settings_dir=settings_dir, workers=settings.server.workers
    )
    settings = msgspec.structs.replace(settings, tenancy=tenancy)
    configure_logging(settings.log_level, settings.observability.log_format)
    # Read once here: the checks, the transports said and the start all take this one.
    spec = parse_sidecar_spec(settings.sidecars) if settings.sidecars is not None else None
    check_before_start(settings, spec)
    server = settings.server
    print(f"triton-gateway: OpenAI API on http://{server.host}:{server.port}/v1", flush=True)
    names = ", ".join(model.name for model in settings.models) or "every pipeline of the spec"
    waits = " once its sidecars have loaded" if settings.sidecars is not None else ""
    print(f"  models: {names}; ready{waits} (/health/ready); Ctrl-C stops", flush=True)
    if server.workers > 1 or settings.tenancy.store.kind == "embedded":
        return _serve_workers(settings, spec)
    from gateway.app import create_app
    from gateway.server import run

    app = create_app(settings, spec=spec)
    runtime = app.state["runtime"]
    # Once started: with the Redis store, the tenants and keys in force are known only then.
    failure = run(
        app,
        settings,
        on_started=lambda: print(f"  {runtime.tenancy.directory.describe()}", flush=True),
    )
    if failure is not None:
        print(f"error: {failure}", file=sys.stderr, flush=True)
        return 1
    return 0


def _serve_workers(settings: Settings, spec: Spec | None) -> int:
    import tempfile

    from gateway.workers.pool import Pool, embedded_data_file, needs_embedded_redis

    check_settings(settings)
    server = settings.server
    limits = "limits shared"
    if needs_embedded_redis(settings):
        data = embedded_data_file(settings)
        kept = f"kept in {data}" if data else "not kept after it stops (tenancy.store.path)"
        limits = f"limits, tenants and keys in an embedded redis-server, {kept}"
    print(f"  {server.workers} worker process(es) on the port; {limits}", flush=True)
    with tempfile.TemporaryDirectory(prefix="triton-gateway-") as folder:
        pool = Pool(settings, Path(folder), spec)
        code = pool.run()
    if pool.failure is not None:
        print(f"error: {pool.failure}", file=sys.stderr, flush=True)
    return code


def _serve(args: argparse.Namespace) -> int:
    settings = load_settings(args.config)
    server = settings.server
    server = msgspec.structs.replace(
        server, host=args.host or server.host, port=args.port or server.port
    )
    settings_dir = Path(args.config).resolve().parent
    return serve(msgspec.structs.replace(settings, server=server), settings_dir)


def _demo(args: argparse.Namespace) -> int:
    print(
        "triton-gateway demo: preparing SmolLM2-135M-Instruct (first run converts it)", flush=True
    )
    if args.disaggregated:
        print(
            f"  disaggregated: prompts of {DEMO_SPLIT_TOKENS} tokens or more are prefilled on the "
            "context sidecar and decoded on the generation sidecar",
            flush=True,
        )
    return serve(demo_settings(args.host, args.port, disaggregated=args.disaggregated))


def _init(args: argparse.Namespace) -> int:
    from deploy.sidecar.models import ensure_smollm2
    from gateway.ops.starter import ADAPTER, MODEL, write_starter

    folder = Path(args.folder)
    print("triton-gateway init: preparing SmolLM2-135M-Instruct (converted once)", flush=True)
    try:
        keys = write_starter(folder, ensure_smollm2())
    except FileExistsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {folder / 'gateway.yaml'}, {folder / 'deploy.yaml'} and the adapter {ADAPTER}")
    print("API keys (shown once; only their sha256 is in gateway.yaml):")
    print(f"  admin:  {keys.admin}")
    print(f"  team-a: {keys.team_a}   ({MODEL} and {ADAPTER})")
    print(f"  team-b: {keys.team_b}   ({MODEL} only)")
    print(f"next: triton-gateway serve --config {folder / 'gateway.yaml'}")
    return 0


def _new_key(args: argparse.Namespace) -> int:
    key = new_key()
    name = f", name: {args.name}" if args.name else ""
    print(f"API key (shown once, store it now): {key}")
    print("Add to tenancy.keys in the gateway configuration:")
    print(f"  - {{tenant: {args.tenant}{name}, sha256: {digest(key)}}}")
    return 0


def _hash_key(args: argparse.Namespace) -> int:
    key = sys.stdin.readline().strip()
    if not key:
        print("error: no key on standard input", file=sys.stderr)
        return 2
    print(digest(key))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``triton-gateway`` argument parser."""
    parser = argparse.ArgumentParser(prog="triton-gateway", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve_cmd = sub.add_parser("serve", help="serve the models of a YAML configuration")
    serve_cmd.add_argument("--config", required=True, help="gateway settings (YAML)")
    serve_cmd.add_argument("--host", help="address to bind (overrides the file)")
    serve_cmd.add_argument("--port", type=int, help="port to bind (overrides the file)")
    serve_cmd.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    serve_cmd.set_defaults(func=_serve)
    demo = sub.add_parser("demo", help="serve SmolLM2-135M-Instruct with no configuration")
    demo.add_argument("--host", default="127.0.0.1", help="address to bind")
    demo.add_argument("--port", type=int, default=8000, help="port to bind")
    demo.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    demo.add_argument(
        "--disaggregated",
        action="store_true",
        help="a context and a generation sidecar, long prompts split between them",
    )
    demo.set_defaults(func=_demo)
    init = sub.add_parser("init", help="write a runnable CPU configuration to start from")
    init.add_argument("folder", help="where to write gateway.yaml, deploy.yaml and an adapter")
    init.set_defaults(func=_init)
    sub.add_parser("deploy", help="render or run sidecars (triton-gateway deploy --help)")
    keys = sub.add_parser("keys", help="make API keys").add_subparsers(dest="keys", required=True)
    new = keys.add_parser("new", help="print a new API key and its configuration line")
    new.add_argument("--tenant", required=True, help="the tenant the key opens")
    new.add_argument("--name", default="", help="what the key is for")
    new.set_defaults(func=_new_key)
    hashed = keys.add_parser("hash", help="print the sha256 of a key read from standard input")
    hashed.set_defaults(func=_hash_key)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``triton-gateway``."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["deploy"]:
        from deploy.sidecar.cli import main as deploy_main

        return deploy_main(args_list[1:])
    args = build_parser().parse_args(args_list)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        return int(args.func(args))
    except SettingsError as exc:
        # One line naming the field; the traceback only when asked for.
        if getattr(args, "debug", False):
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
