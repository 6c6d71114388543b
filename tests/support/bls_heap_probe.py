"""Our BLS with a probe for responses freed off Python threads: the model file a test puts in
place of ``tensorrt_llm_bls/1/model.py``.

Every array the BLS takes out of an inner model's response gets a weak-reference callback. An
array released on one of the stub's own C++ threads, which hold no GIL and have no Python
thread state, runs that callback there and the stub dies at once, instead of at some later
allocation. A thread floods the stub's log queue, which its stub-to-parent thread works
through, and competes for the GIL, as load does. Every second the probe logs how many arrays
went, by thread.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import weakref
from collections import Counter
from typing import Any

import triton_python_backend_utils as pb_utils

from deploy.triton.pipeline import bls_model
from deploy.triton.pipeline.bls_model import TritonPythonModel as _BlsModel

logger = logging.getLogger("bls_heap_probe")
FLOOD_MESSAGES = 100
FLOOD_PAUSE_S = 0.05

_freed: Counter[str] = Counter()
_refs: dict[int, weakref.ref[Any]] = {}
_ids = itertools.count()
_reading = bls_model._as_arrays


def _watched(response: Any) -> dict[str, Any]:
    arrays = _reading(response)
    for array in arrays.values():
        key = next(_ids)

        def gone(_: object, key: int = key) -> None:
            _refs.pop(key, None)
            _freed[threading.current_thread().name] += 1

        _refs[key] = weakref.ref(array, gone)
    return arrays


bls_model._as_arrays = _watched  # type: ignore[assignment]


def _flood() -> None:
    last = time.monotonic()
    while True:
        for _ in range(FLOOD_MESSAGES):
            pb_utils.Logger.log_verbose("bls heap probe")
        time.sleep(FLOOD_PAUSE_S)
        if time.monotonic() - last >= 1.0:
            last = time.monotonic()
            logger.warning("probe: arrays freed %d, by thread %s", sum(_freed.values()), _freed)


class TritonPythonModel(_BlsModel):
    """The BLS, with the log flood running."""

    def initialize(self, args: dict[str, str]) -> None:
        super().initialize(args)
        threading.Thread(target=_flood, name="probe-flood", daemon=True).start()
