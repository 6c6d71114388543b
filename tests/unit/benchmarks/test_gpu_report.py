"""The GPU benchmark's figures: the quantile of a Prometheus histogram, tokens per step, and what
one scrape of the metrics gives."""

from __future__ import annotations

import dataclasses
import math

from tests.benchmarks.gpu_readings import engine_steps, served_ttft, triton_counters
from tests.benchmarks.gpu_report import bucket_quantile, summarise
from tests.support.prometheus import parse


def test_bucket_quantile_is_the_bound_of_the_bucket_that_holds_it() -> None:
    # Cumulative counts: 90 requests within 0.1 s, 99 within 1 s, all 100 within 5 s.
    buckets = {0.1: 90.0, 1.0: 99.0, 5.0: 100.0, math.inf: 100.0}
    assert bucket_quantile(buckets, 0.5) == 0.1
    assert bucket_quantile(buckets, 0.9) == 0.1
    assert bucket_quantile(buckets, 0.95) == 1.0
    assert bucket_quantile(buckets, 0.999) == 5.0


def test_bucket_quantile_of_nothing_is_unknown() -> None:
    assert math.isnan(bucket_quantile({}, 0.5))
    assert math.isnan(bucket_quantile({0.1: 0.0, math.inf: 0.0}, 0.5))


def test_tokens_per_step_are_the_level_tokens_over_the_engine_steps() -> None:
    results = [
        {"arrivals": [0.1 * i for i in range(1, 9)], "end": 1.0, "tokens": 8} for _ in range(4)
    ]
    level = summarise("direct", 4, results, wall=2.0, expected=8)
    assert math.isnan(level.tokens_per_step)
    stepped = level.with_steps(10)
    assert stepped.engine_steps == 10
    assert stepped.tokens_per_step == 32 / 10
    assert math.isnan(level.with_steps(0).tokens_per_step)


def test_only_a_level_the_gateway_served_shows_the_gateways_own_ttft() -> None:
    results = [{"arrivals": [0.1, 0.2], "end": 0.2, "tokens": 2}]
    direct = summarise("direct", 1, results, wall=1.0, expected=2)
    assert "gateway's own" not in direct.line()
    served = dataclasses.replace(direct, target="gateway", served_ttft_p99_s=0.25)
    assert served.line().endswith("gateway's own TTFT p99 <= 0.25 s")


METRICS = """# HELP nv_trt_llm_general_metrics General TRT LLM metrics
# TYPE nv_trt_llm_general_metrics gauge
nv_trt_llm_general_metrics{general_type="iteration_counter",model="llama-1b_tensorrt_llm"} 517
nv_trt_llm_general_metrics{general_type="iteration_counter",model="llama-160m_tensorrt_llm"} 9
nv_inference_request_success{model="ensemble",version="1"} 512
nv_inference_queue_duration_us{model="ensemble",version="1"} 1.5e+03
gateway_time_to_first_token_seconds_bucket{le="0.1",model="llama-1b"} 90.0
gateway_time_to_first_token_seconds_bucket{le="+Inf",model="llama-1b"} 100.0
gateway_time_to_first_token_seconds_bucket{le="0.1",model="llama-160m"} 5.0
"""


def test_one_scrape_gives_steps_counters_and_the_served_histogram() -> None:
    samples = parse(METRICS)
    assert engine_steps(samples, "llama-1b") == 517
    assert engine_steps(samples, "llama-160m") == 9
    assert engine_steps(samples, "absent") == 0
    assert triton_counters(samples) == {
        "nv_inference_request_success{ensemble}": 512.0,
        "nv_inference_queue_duration_us{ensemble}": 1500.0,
    }
    assert served_ttft(samples, "llama-1b") == {0.1: 90.0, math.inf: 100.0}


def test_the_report_says_how_the_gateway_kept_its_connections_to_triton() -> None:
    from tests.benchmarks.gpu_report import _kept

    assert _kept({"triton_keep_alive_s": 0.0}) == ", a connection to Triton per request"
    assert _kept({"triton_keep_alive_s": 30.0}) == ", connections to Triton kept alive 30 s"
    assert _kept({}) == "", "a report from before the setting says nothing"


def test_the_report_says_which_cpus_each_role_ran_on() -> None:
    from tests.benchmarks.gpu_report import _cpus

    sets = {"cpus": ["triton=0-9", "load=14-15"], "cpu_siblings": "0 1 2"}
    assert _cpus(sets) == (
        " CPU sets: triton=0-9 (tritonserver and its stubs); load=14-15 (this benchmark's "
        "clients); core siblings 0 1 2."
    )
    assert _cpus({"cpus": []}) == "" and _cpus({}) == "", "a run on every core says nothing"


def test_the_report_says_when_targets_ran_beside_direct() -> None:
    from tests.benchmarks.gpu_report import _order

    assert "Side by side" in _order({"side_by_side": True}, 4)
    assert _order({"side_by_side": False}, 4).startswith("- 4 runs per level, the targets")
    assert _order({}, 3).startswith("- 3 runs per level"), "a report from before the option"
    assert "rotated" in _order({"order": "turned"}, 6)
    assert "rotated" not in _order({}, 6), "a report from before the turning order"


def _run(target: str, repeat: int, tokens_per_s: float, itl: float) -> dict:
    return {"target": target, "concurrency": 128, "repeat": repeat, "tokens_per_s": tokens_per_s,
            "ttft_p50_ms": 500.0 + repeat, "itl_p50_ms": itl}  # fmt: skip


def test_runs_pair_up_by_repeat_so_a_drifting_host_falls_on_both_sides() -> None:
    from tests.benchmarks.gpu_pairs import pairs

    # The host speeds up run after run; the gateway is 2% behind direct in every run.
    rates = (1000.0, 2000.0, 3000.0)
    levels = [_run("direct", r, rate, 30.0 - r) for r, rate in enumerate(rates)]
    levels += [_run("gateway", r, 0.98 * rate, 30.5 - r) for r, rate in enumerate(rates)]
    levels.append(_run("gateway", 7, 9999.0, 1.0))  # no direct run of its repeat: no pair
    found = pairs(levels, "gateway", "direct")
    assert list(found) == [128]
    assert [round(share, 6) for share, _, _ in found[128]] == [98.0, 98.0, 98.0]
    assert [itl for _, _, itl in found[128]] == [0.5, 0.5, 0.5]
    assert [ttft for _, ttft, _ in found[128]] == [0.0, 0.0, 0.0]


def test_the_report_shows_the_pairs_against_direct_and_against_the_client_asking_the_same() -> None:
    from tests.benchmarks.gpu_pairs import paired_table

    levels = []
    for repeat, (direct, counts, gateway) in enumerate(((100, 96, 95), (200, 190, 192))):
        levels += [
            _run("direct", repeat, direct, 30.0),
            _run("direct-counts", repeat, counts, 31.0),
            _run("gateway", repeat, gateway, 31.25),
        ]
    lines = paired_table(levels, ["direct", "direct-counts", "gateway"])
    rows = [line for line in lines if line.startswith("| 128 ")]
    assert rows == [
        "| 128 | direct-counts | direct | 2 | 95.5% [95.0, 96.0] | +0.0 [+0.0, +0.0] | +1.00 [+1.00, +1.00] |",  # noqa: E501
        "| 128 | gateway | direct | 2 | 95.5% [95.0, 96.0] | +0.0 [+0.0, +0.0] | +1.25 [+1.25, +1.25] |",  # noqa: E501
        "| 128 | gateway | direct-counts | 2 | 100.0% [99.0, 101.1] | +0.0 [+0.0, +0.0] | +0.25 [+0.25, +0.25] |",  # noqa: E501
    ]
    single = [_run("direct", 0, 100.0, 30.0), _run("gateway", 0, 90.0, 31.0)]
    assert paired_table(single, ["direct", "gateway"]) == [], "one run makes no spread of pairs"


def test_side_by_side_a_target_is_compared_with_the_direct_runs_beside_its_own() -> None:
    from tests.benchmarks.gpu_clients import schedule
    from tests.benchmarks.gpu_pairs import beside

    # Direct ran slower beside the client than beside the gateway (other engine steps).
    levels = []
    for group in schedule(["direct", "direct-counts", "gateway"], 2, side_by_side=True):
        (_, repeat), (other, _) = group
        rate = 1000.0 if other == "gateway" else 500.0
        levels += [_run("direct", repeat, rate, 30.0), _run(other, repeat, 0.99 * rate, 30.1)]
    direct = [run for run in levels if run["target"] == "direct"]
    gateway = [run for run in levels if run["target"] == "gateway"]
    base = beside(direct, gateway)
    assert base["tokens_per_s"] == 1000.0
    assert {run["repeat"] for run in gateway} == {1, 2}


def test_the_gateway_is_also_paired_with_the_client_sending_all_it_sends() -> None:
    from tests.benchmarks.gpu_pairs import paired_table

    targets = ["direct", "direct-greedy", "direct-greedy-counts-perf", "gateway"]
    levels = [
        _run(target, repeat, 100.0, 30.0 + index)
        for repeat in range(2)
        for index, target in enumerate(targets)
    ]
    rows = [line.split(" | ")[1:3] for line in paired_table(levels, targets) if "| 128 " in line]
    assert rows == [
        ["direct-greedy", "direct"],
        ["direct-greedy-counts-perf", "direct"],
        ["gateway", "direct"],
        ["gateway", "direct-greedy-counts-perf"],
    ]
