"""The engine profile's split of the engine thread's samples by phase."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.benchmarks.engine_profile import split

ROOT = "thread (7): torch-engine;Thread.run (threading.py:982);Engine._run (scheduler.py:184)"


def test_samples_go_to_the_first_phase_frame_on_the_engine_threads_stack(tmp_path: Path) -> None:
    folded = tmp_path / "engine.folded"
    folded.write_text(
        "\n".join(
            [
                f"{ROOT};Engine._step (s.py:1);ModelRunner.decode (r.py:2);Linear.forward 6",
                f"{ROOT};Engine._step (s.py:1);DecodeBatch.advance (b.py:4) 2",
                f"{ROOT};Engine._deliver (s.py:5);TritonPythonModel._on_output (t.py:6) 1",
                f"{ROOT};Engine._pump (s.py:7) 1",
                "thread (8): engine-sender;TritonPythonModel._send_loop (t.py:9) 50",
            ]
        )
        + "\n"
    )
    shares = split(folded)
    assert shares["samples"] == 10
    assert shares["forward"] == pytest.approx(0.6)
    assert shares["sampling and bookkeeping"] == pytest.approx(0.2)
    assert shares["responses"] == pytest.approx(0.1)
    assert shares["other"] == pytest.approx(0.1)
    assert shares["prefill"] == 0
