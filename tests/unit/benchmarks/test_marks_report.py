"""The marks report's reading of every request's step marks (pure arithmetic on made-up marks)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.benchmarks.marks_report import engine_steps, load, report, triton_calls


def _request(
    entry: int, *, first: int, last: int, exit_: int, dial: bool = False
) -> dict[str, int]:
    marks = {
        "asgi.entry": entry,
        "tokenize.start": entry + 100_000,
        "tokenize.end": entry + 300_000,
        "first_body.send": entry + first,
        "last_body.send": entry + last,
        "asgi.exit": entry + exit_,
    }
    if dial:
        marks["triton.dial.start"] = entry + 350_000
        marks["triton.dial.end"] = entry + 2_000_000
    return marks


def test_turns_overlaps_dials_and_workers_are_counted() -> None:
    # One connection of worker 7: the second request enters 0.5 ms after the first's last write,
    # while the first is still in the app (it leaves 1 ms after that write); the third enters
    # 4 ms after the second's last write, the second long gone. Worker 8 holds one connection.
    marks = {
        "any-7-0-5000-text": _request(0, first=5_000_000, last=10_000_000, exit_=11_000_000),
        "any-7-1-5000-text": _request(
            10_500_000, first=6_000_000, last=20_000_000, exit_=20_200_000, dial=True
        ),
        "any-7-2-5000-text": _request(34_500_000, first=7_000_000, last=9_000_000, exit_=9_100_000),
        "any-8-0-6000-text": _request(0, first=4_000_000, last=8_000_000, exit_=8_100_000),
    }
    text = report(marks)
    assert "4 requests on 2 connections." in text
    assert "| tokenize.start → tokenize.end | 200 |" in text
    # The dial, taken by one request in four, is counted apart, not placed among the steps.
    assert "triton.dial" not in text.split("| worker |")[0]
    assert "dialled one on their way: 1 (25.0%)" in text
    assert "| 7 | 1 | 3 |" in text
    assert "| 8 | 1 | 1 |" in text
    # Turns of 500 and 4,000 µs; one of the two next requests entered 500 µs before the exit.
    assert "p50 / p90 / p99 µs: 4,000 / 4,000 / 4,000 (2 requests)" in text
    assert "still in the app: 50%, by a median of 500 µs." in text


def test_engine_marks_join_their_request_and_loop_lags_show_per_worker(tmp_path: Path) -> None:
    request = {"probe": "any-7-0-5000-text", "triton_id": "cmpl-1",
               **_request(0, first=5_000_000, last=9_000_000, exit_=9_500_000)}  # fmt: skip
    request.update({"triton.send.start": 400_000, "triton.written": 500_000,
                    "triton.arrived": 2_100_000})  # fmt: skip
    unjoined = {"probe": "any-7-1-5001-text", "triton_id": "cmpl-2",
                **_request(0, first=5_000_000, last=9_000_000, exit_=9_500_000)}  # fmt: skip
    engine = {"triton_id": "cmpl-1", "engine.accept": 1_400_000,
              "engine.first_send.start": 1_500_000, "engine.first_send.end": 1_600_000}  # fmt: skip
    lags = {"loop": 7, "lags": [1_000, 2_000, 300_000]}
    lines = [json.dumps(line) for line in (request, unjoined, lags)]
    (tmp_path / "marks-7.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "engine-99.jsonl").write_text(json.dumps(engine) + "\n")
    run = load(tmp_path)
    joined = run.requests["text"]["any-7-0-5000-text"]
    assert joined["engine.accept"] - joined["triton.written"] == 900_000
    assert "engine.accept" not in run.requests["text"]["any-7-1-5001-text"]
    assert "triton_id" not in joined
    assert run.loop_lags == {"7": [1_000, 2_000, 300_000]}
    text = report(run.requests["text"], run.loop_lags)
    assert "| triton.written → engine.accept | 900 |" in text
    assert "| 7 | 2 | 2 | 5,000 / 5,000 / 5,000 | 2 / 300 / 300 |" in text
    # The Triton call split where the engine took it and answered, for the one request joined.
    assert "The Triton call of 1 requests" in text
    assert "| triton.written | engine.accept | into the engine" in text
    assert "| 900 / 900 / 900 |" in text  # written to accepted
    out = "| engine.first_send.start | triton.arrived | out to the worker's read callback | 600 /"
    assert out in text


def _engine(triton_id: str, accept: int, prefill: int) -> dict[str, int | str]:
    return {"triton_id": triton_id, "engine.accept": accept, "engine.parsed": accept + 200_000,
            "engine.first_output": accept + 200_000 + prefill,
            "engine.first_send.start": accept + 300_000 + prefill,
            "engine.first_send.end": accept + 400_000 + prefill}  # fmt: skip


def test_direct_requests_engine_marks_go_with_the_gateway_requests_that_followed(
    tmp_path: Path,
) -> None:
    # Direct text at 0-1 s, the gateway's text at 2 s, direct chat at 3 s, the gateway's chat at
    # 5 s: each direct request belongs to the endpoint the gateway measured next.
    gateway = []
    for key, entry, triton_id in (("any-7-0-5000-text", 2_000_000_000, "t"),
                                  ("any-7-1-5001-chat", 5_000_000_000, "c")):  # fmt: skip
        request = {"probe": key, "triton_id": triton_id,
                   **_request(entry, first=5_000_000, last=9_000_000, exit_=9_500_000)}  # fmt: skip
        gateway.append(request)
    engine = [
        _engine("", 0, 2_000_000),
        _engine("", 1_000_000_000, 4_000_000),
        _engine("t", 2_000_100_000, 3_000_000),
        _engine("", 3_000_000_000, 5_000_000),
        _engine("c", 5_000_100_000, 6_000_000),
        _engine("", 6_000_000_000, 1_000_000),  # after every gateway request: no endpoint
    ]
    (tmp_path / "marks-7.jsonl").write_text("\n".join(map(json.dumps, gateway)) + "\n")
    (tmp_path / "engine-99.jsonl").write_text("\n".join(map(json.dumps, engine)) + "\n")
    run = load(tmp_path)
    prefills = {
        endpoint: sorted(m["engine.first_output"] - m["engine.parsed"] for m in marks)
        for endpoint, marks in run.direct.items()
    }
    assert prefills == {"text": [2_000_000, 4_000_000], "chat": [5_000_000]}
    lines = engine_steps(run.requests["text"].values(), run.direct["text"])
    assert lines[0].startswith("In the engine, 2 direct requests and 1 through the gateway")
    prefill = next(line for line in lines if line.startswith("| engine.parsed |"))
    # Direct's p50 of two values is the higher one (as _quantiles_us takes it).
    assert prefill.endswith("| 4,000 / 4,000 / 4,000 | 3,000 / 3,000 / 3,000 |")
    assert engine_steps([], []) == []


def test_direct_requests_the_load_generator_named_are_timed_beside_the_gateways(
    tmp_path: Path,
) -> None:
    # The gateway's text request at 2 s, written 0.5 ms after it entered; two direct requests
    # before it, which the load generator named and marked: Triton took 0.3 and 0.5 ms to hand
    # them to the engine, against 0.9 ms for the gateway's.
    entry = 2_000_000_000
    gateway = {"probe": "any-7-0-5000-text", "triton_id": "t",
               **_request(entry, first=5_000_000, last=9_000_000, exit_=9_500_000),
               "triton.written": entry + 500_000, "triton.arrived": entry + 4_800_000}  # fmt: skip
    engine = [
        _engine("direct-9-0", 300_000, 2_000_000),
        _engine("direct-9-1", 1_000_500_000, 2_000_000),
        _engine("t", entry + 1_400_000, 2_000_000),
    ]
    # The first direct request's answer came 0.2 ms after the engine's send started, the
    # second's 0.4 ms after.
    direct = [
        {"triton_id": "direct-9-0", "triton.written": 0, "triton.arrived": 2_800_000},
        {"triton_id": "direct-9-1", "triton.written": 1_000_000_000,
         "triton.arrived": 1_000_000_000 + 3_200_000},
    ]  # fmt: skip
    (tmp_path / "marks-7.jsonl").write_text(json.dumps(gateway) + "\n")
    (tmp_path / "engine-99.jsonl").write_text("\n".join(map(json.dumps, engine)) + "\n")
    (tmp_path / "direct-9.jsonl").write_text("\n".join(map(json.dumps, direct)) + "\n")
    run = load(tmp_path)
    assert len(run.direct["text"]) == 2
    lines = triton_calls(run.requests["text"].values(), run.direct["text"])
    assert lines[0].startswith("The Triton call of 2 direct requests")
    into = next(line for line in lines if line.startswith("| triton.written | engine.accept |"))
    # Direct's p50 of two values is the higher one (as _quantiles_us takes it).
    assert into.endswith("| 500 / 500 / 500 | 900 / 900 / 900 |")
    out = next(line for line in lines if line.startswith("| engine.first_send.start |"))
    assert out.endswith("| 400 / 400 / 400 | 1,100 / 1,100 / 1,100 |")
    assert triton_calls(run.requests["text"].values(), []) == []
