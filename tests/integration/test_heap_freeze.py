"""A served process leaves what its start-up built out of later garbage collections."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

FREEZE = """
import gc, json
from gateway.server import freeze_heap

class Node:
    pass

built = [Node() for _ in range(1000)]
freeze_heap()
frozen = gc.get_freeze_count()
tracked = len(gc.get_objects())

a, b = Node(), Node()
a.other, b.other = b, a
del a, b
print(json.dumps({"frozen": frozen, "tracked": tracked, "collected": gc.collect()}))
"""

SERVE = """
import gc, os, signal, sys
from gateway.app import create_app
from gateway.server import run
from gateway.settings import LimitSettings, ModelSettings, ServerSettings, Settings
from gateway.tenancy import TenancySettings

settings = Settings(
    models=(ModelSettings(name="m", triton_url="127.0.0.1:1", tokenizer_dir=sys.argv[1]),),
    tenancy=TenancySettings(auth=False),
    server=ServerSettings(port=0),
    limits=LimitSettings(drain_delay_s=0, shutdown_grace_s=1),
)

def started():
    print("frozen", gc.get_freeze_count(), flush=True)
    os.kill(os.getpid(), signal.SIGTERM)

run(create_app(settings), settings, on_started=started)
"""


def test_start_up_objects_are_frozen_and_later_cycles_still_collected() -> None:
    done = subprocess.run(
        [sys.executable, "-c", FREEZE], capture_output=True, text=True, timeout=120, check=True
    )
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["frozen"] >= 1000
    assert figures["tracked"] < 100
    assert figures["collected"] >= 2


def test_a_served_app_is_frozen_once_it_listens(tiny_model_dir: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SERVE, str(tiny_model_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("frozen ")]
    assert lines, done.stderr[-2000:]
    assert int(lines[0].split()[1]) > 10_000
