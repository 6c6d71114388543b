"""The resident memory of every process of `triton-gateway demo` and of the starter
(`triton-gateway init` then `serve`), once ready and after a few requests.

    python -m tests.benchmarks.memory

Prints one row per process: the gateway's own, tritonserver, and each Python-backend stub
(the engine's, the pipeline's text models), with the RSS and whether torch is loaded there
(read from its memory maps). What it prints is what `docs/performance.md` states.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import psutil

from tests.support.gateway import became_ready, free_port, stop_process

COMMAND = str(Path(sys.executable).parent / "triton-gateway")
QUESTION = {"role": "user", "content": "What is the capital of France?"}


def _role(process: psutil.Process) -> str:
    command = " ".join(process.cmdline())
    if "triton_python_backend_stub" in command:
        parts = Path(process.cmdline()[1]).parts
        return f"stub: {parts[parts.index('1') - 1] if '1' in parts else parts[-1]}"
    if "tritonserver" in command:
        return "tritonserver"
    if "redis-server" in command:
        return "redis-server (embedded store)"
    if "resource_tracker" in command:
        return "multiprocessing's resource tracker"
    if "multiprocessing" in command:
        return "gateway worker"
    return "gateway"


def _uses_torch(process: psutil.Process) -> bool:
    try:
        return any("libtorch" in m.path for m in process.memory_maps())
    except (psutil.AccessDenied, psutil.NoSuchProcess):
        return False


def _report(title: str, root: psutil.Process) -> None:
    print(f"\n{title}")
    print("| process | RSS MiB | torch loaded |")
    print("|---|---:|---|")
    total = 0
    for process in [root, *root.children(recursive=True)]:
        rss = process.memory_info().rss
        total += rss
        print(
            f"| {_role(process)} | {rss / 2**20:.0f} | {'yes' if _uses_torch(process) else 'no'} |"
        )
    print(f"| all together | {total / 2**20:.0f} | |")


def _serve(title: str, command: list[str], headers: dict[str, str], model: str) -> None:
    port = free_port()
    process = subprocess.Popen(
        [*command, "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    try:
        if not became_ready(url, process, 300, poll_s=0.5):
            raise SystemExit(f"{title}: the gateway did not become ready")
        body = {"model": model, "messages": [QUESTION], "max_tokens": 16, "temperature": 0}
        for _ in range(4):
            httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=120)
        _report(title, psutil.Process(process.pid))
    finally:
        stop_process(process)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args()
    _serve("triton-gateway demo", [COMMAND, "demo"], {}, "smollm2")
    with tempfile.TemporaryDirectory() as folder:
        starter = Path(folder) / "my-gateway"
        printed = subprocess.run(
            [COMMAND, "init", str(starter)], capture_output=True, text=True, check=True
        ).stdout
        key = next(line.split()[1] for line in printed.splitlines() if "team-a:" in line)
        command = [COMMAND, "serve", "--config", str(starter / "gateway.yaml")]
        _serve("the starter", command, {"Authorization": f"Bearer {key}"}, "smollm2")


if __name__ == "__main__":
    main()
