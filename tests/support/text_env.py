"""A text environment as ``deploy.devtools.offline install`` makes one: the gateway's runtime
packages without torch, this interpreter's numpy linked in. Python-backend models that need no
torch start in it without importing torch (transformers imports torch whenever it can)."""

from __future__ import annotations

import sys
from importlib.metadata import distribution
from pathlib import Path

from deploy.devtools.offline import _layer, _text_view, link_distribution, runtime_closure

VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"


def make_text_env(root: Path) -> Path:
    """Build the environment under ``root``; its folder (an ``EXECUTION_ENV_PATH``)."""
    view = _text_view(root / "text-view", runtime_closure(VERSION))
    env = root / "text-env"
    site = _layer(env, [str(view)])
    link_distribution(distribution("numpy"), site)
    return env
