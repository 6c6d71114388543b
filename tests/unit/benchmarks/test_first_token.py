"""The first-token probe's step table: marks of several requests into median gaps, in order."""

from __future__ import annotations

import json
from pathlib import Path

from tests.benchmarks.first_token import probe_marks, steps


def test_steps_are_ordered_by_when_requests_reach_them_and_gaps_are_medians() -> None:
    marks = [
        {"client.send": 0, "asgi.entry": 300, "plan.start": 400, "client.first_token": 5000},
        {"client.send": 10, "plan.start": 600, "asgi.entry": 250, "client.first_token": 7010},
        {"client.send": 20, "asgi.entry": 420, "plan.start": 520, "client.first_token": 6020},
    ]
    assert steps(marks) == [
        ("client.send → asgi.entry", 0.3),
        ("asgi.entry → plan.start", 0.1),
        ("plan.start → client.first_token", 5.5),
    ]


def test_a_step_some_requests_skip_counts_only_those_that_reached_it() -> None:
    marks = [
        {"client.send": 0, "images.start": 100, "client.first_token": 1000},
        {"client.send": 0, "client.first_token": 3000},
    ]
    assert steps(marks) == [
        ("client.send → images.start", 0.1),
        ("images.start → client.first_token", 0.9),
    ]


def test_probe_marks_take_the_engine_marks_of_their_triton_call(tmp_path: Path) -> None:
    probes = [
        {"probe": "completions-0", "triton_id": "cmpl-1", "asgi.entry": 100},
        {"probe": "chat-0", "triton_id": "cmpl-2", "asgi.entry": 200},
        {"loop": 7, "lags": [10, 20]},
    ]
    engine = [
        {"triton_id": "cmpl-1", "engine.accept": 150, "engine.first_send.end": 900},
        {"triton_id": "", "engine.accept": 160},
    ]
    (tmp_path / "marks-7.jsonl").write_text("\n".join(map(json.dumps, probes)) + "\n")
    (tmp_path / "engine-9.jsonl").write_text("\n".join(map(json.dumps, engine)) + "\n")
    assert probe_marks(tmp_path) == {
        "completions-0": {"asgi.entry": 100, "engine.accept": 150, "engine.first_send.end": 900},
        "chat-0": {"asgi.entry": 200},
    }
