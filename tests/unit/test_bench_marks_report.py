"""The marks report's reading of every request's step marks (pure arithmetic on made-up marks)."""

from __future__ import annotations

from tests.benchmarks.marks_report import report


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
