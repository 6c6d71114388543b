"""LiteLLM's proxy for the serving benchmark: a pinned version in its own virtualenv, configured
for Triton's ``triton/`` provider without any network lookup."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import yaml

from deploy.sidecar.ports import free_port
from deploy.sidecar.supervisor import Sidecar
from tests.support import REPO
from tests.support.gateway import stop_process

VERSION = "1.106.1"
VENV = REPO / ".bench" / "litellm"
PIPELINES = ("loadtest", "tiny")
# No network: the model cost map, blog posts and beta headers from the package, no hub lookups.
ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS": "True",
    "LITELLM_LOCAL_BLOG_POSTS": "True",
    "LITELLM_LOG": "ERROR",
    "HF_HUB_OFFLINE": "1",
    "DISABLE_ADMIN_UI": "True",
}


def ensure_venv() -> Path:
    """The virtualenv holding ``litellm[proxy]`` at the pinned version, made on first use."""
    litellm = VENV / "bin" / "litellm"
    marker = VENV / f".litellm-{VERSION}"
    if litellm.exists() and marker.exists():
        return VENV
    print(f"installing litellm[proxy]=={VERSION} into {VENV} (once)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
    subprocess.run(
        [str(VENV / "bin" / "pip"), "install", "-q", f"litellm[proxy]=={VERSION}"], check=True
    )
    marker.touch()
    return VENV


def proxy_config(sidecar: Sidecar, tokenizer_dir: Path) -> dict[str, object]:
    """Both pipelines' ensembles through the generate endpoints, with the model's chat template
    pre-filled (``known_tokenizer_config``) so no request looks it up on the Hugging Face hub."""
    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    template = config["chat_template"]
    tokenizer = {
        "chat_template": template,
        "bos_token": config.get("bos_token") or "",
        "eos_token": config.get("eos_token") or "",
    }
    base = f"http://127.0.0.1:{sidecar.http_port}/v2/models"
    return {
        "model_list": [
            {
                "model_name": name,
                "litellm_params": {
                    "model": f"triton/{name}",
                    "api_base": f"{base}/{name}_ensemble/generate",
                },
            }
            for name in PIPELINES
        ],
        "litellm_settings": {
            "drop_params": True,
            "num_retries": 0,
            "request_timeout": 600,
            "set_verbose": False,
            "turn_off_message_logging": True,
            "known_tokenizer_config": {
                name: {"status": "success", "tokenizer": tokenizer} for name in PIPELINES
            },
        },
        "general_settings": {"disable_spend_logs": True, "disable_error_logs": True},
    }


@asynccontextmanager
async def running(
    venv: Path, sidecar: Sidecar, tokenizer_dir: Path, workdir: Path, key: str
) -> AsyncIterator[tuple[str, int]]:
    """The proxy on a free port with one worker; yields its URL and process id."""
    path = workdir / "litellm.yaml"
    path.write_text(yaml.safe_dump(proxy_config(sidecar, tokenizer_dir)))
    port = free_port()
    command = [str(venv / "bin" / "litellm"), "--config", str(path), "--host", "127.0.0.1",
               "--port", str(port), "--num_workers", "1"]  # fmt: skip
    env = {**os.environ, **ENV, "LITELLM_MASTER_KEY": key}
    log = (workdir / "litellm.log").open("wb")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        await _wait_alive(url, process, workdir / "litellm.log")
        yield url, process.pid
    finally:
        stop_process(process, 30)
        log.close()


async def _wait_alive(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 120
    async with httpx.AsyncClient() as client:
        while True:
            try:
                if (await client.get(f"{url}/health/liveliness", timeout=2)).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"LiteLLM did not start: {log.read_text()[-3000:]}")
            await asyncio.sleep(0.5)
