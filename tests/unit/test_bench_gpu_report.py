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
