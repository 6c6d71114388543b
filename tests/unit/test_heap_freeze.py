"""A served process leaves what its start-up built out of later garbage collections."""

from __future__ import annotations

import json
import subprocess
import sys

CHECK = """
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


def test_start_up_objects_are_frozen_and_later_cycles_still_collected() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120, check=True
    )
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["frozen"] >= 1000
    assert figures["tracked"] < 100
    assert figures["collected"] >= 2
