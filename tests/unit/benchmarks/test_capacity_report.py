"""The capacity report's baselines: text rows against direct Triton given the prompt's ids, chat
rows against direct Triton given the templated conversation's ids, never the other's; with
several rounds, each round against its own direct rows."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from tests.benchmarks.capacity_load import Row
from tests.benchmarks.capacity_report import render_markdown


def _row(
    target: str, endpoint: str, tokens_per_s: float, ttft_ms: float, round_: int = 0
) -> dict[str, Any]:
    return asdict(
        Row(
            target,
            endpoint,
            64,
            tokens_per_s,
            ttft_ms,
            ttft_ms,
            12.5,
            13.0,
            10,
            0,
            None,
            {},
            round=round_,
        )
    )


def _report(rows: list[dict[str, Any]]) -> dict[str, Any]:
    machine = {"cpus": 2, "cpu_model": "cpu", "python": "3.11", "host": "h"}
    conditions = {"rate_tokens_per_s_per_stream": 80, "tokens": 128, "prompt_tokens": 41,
                  "chat_prompt_tokens": 54, "engine_instances": 8, "seconds_per_level": 5,
                  "client_processes": 1, "arrivals": "staggered"}  # fmt: skip
    return {"machine": machine, "date": "d", "conditions": conditions, "rows": rows}


def _cells(markdown: str, target: str, endpoint: str) -> list[str]:
    line = next(ln for ln in markdown.splitlines() if ln.startswith(f"| {target} | {endpoint} |"))
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_chat_rows_are_measured_against_the_direct_chat_prompt() -> None:
    markdown = render_markdown(
        _report([
            _row("direct", "text", 5000, 3.0),
            _row("direct", "chat", 4000, 3.5),
            _row("gateway-8", "text", 4900, 4.5),
            _row("gateway-8", "chat", 4000, 5.0),
        ])
    )  # fmt: skip
    assert "a 41-token prompt (54 as a chat)" in markdown
    text, chat = _cells(markdown, "gateway-8", "text"), _cells(markdown, "gateway-8", "chat")
    assert (text[4], text[6]) == ("98.0%", "+1.50")
    assert (chat[4], chat[6]) == ("100.0%", "+1.50")


def test_a_chat_row_without_its_direct_baseline_has_none() -> None:
    markdown = render_markdown(
        _report([_row("direct", "text", 5000, 3.0), _row("gateway-8", "chat", 4000, 5.0)])
    )
    chat = _cells(markdown, "gateway-8", "chat")
    assert (chat[4], chat[6]) == ("-", "-")


def test_rounds_are_measured_against_their_own_direct_rows_and_summed_up() -> None:
    rows = [
        _row("direct", "text", 5000, 3.0, 0),
        _row("gateway-8", "text", 5000, 5.0, 0),
        _row("direct", "text", 5000, 4.0, 1),
        _row("gateway-8", "text", 4950, 5.5, 1),
        _row("direct", "text", 5000, 3.5, 2),
        _row("gateway-8", "text", 4900, 4.5, 2),
    ]
    markdown = render_markdown(_report(rows))
    assert _cells(markdown, "gateway-8 #0", "text")[6] == "+2.00"
    assert _cells(markdown, "gateway-8 #1", "text")[6] == "+1.50"
    assert _cells(markdown, "gateway-8 #2", "text")[6] == "+1.00"
    summary = markdown.split("Over the 3 rounds", 1)[1]
    line = _cells(summary, "gateway-8", "text")
    assert line[3:6] == ["3", "99.0% [98.0, 100.0]", "+1.50 [+1.00, +2.00]"]
    assert not any(ln.startswith("| direct |") for ln in summary.splitlines())


def test_one_round_has_no_summary() -> None:
    markdown = render_markdown(
        _report([_row("direct", "text", 5000, 3.0), _row("gateway-8", "text", 5000, 5.0)])
    )
    assert "Over the" not in markdown
    assert _cells(markdown, "gateway-8", "text")[6] == "+2.00"
