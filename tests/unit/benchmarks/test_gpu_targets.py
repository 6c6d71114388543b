"""The GPU benchmark's targets: one gateway model per way to Triton (transport and entry), each
named after what tells it from the others."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from tests.benchmarks.gpu_clients import (
    Way,
    gateway_model,
    gateway_targets,
    gateway_ways,
    schedule,
    turn,
)
from tests.benchmarks.gpu_setup import gateway_config


def test_one_way_is_the_plain_gateway_under_the_pipelines_name() -> None:
    ways = gateway_ways(["http"], ["ensemble"])
    assert ways == [Way("http", "ensemble")]
    assert gateway_targets(ways) == ["gateway"]
    assert gateway_model("llama", ways[0], ways) == "llama"


def test_ways_are_named_by_what_differs() -> None:
    entries = gateway_ways(["http"], ["ensemble", "tensorrt_llm"])
    assert gateway_targets(entries) == ["gateway-ensemble", "gateway-engine"]
    assert [gateway_model("m", w, entries) for w in entries] == ["m", "m-engine"]
    transports = gateway_ways(["http", "grpc"], ["ensemble"])
    assert gateway_targets(transports) == ["gateway-http", "gateway-grpc"]
    both = gateway_ways(["http", "grpc"], ["ensemble", "tensorrt_llm"])
    assert gateway_targets(both) == [
        "gateway-http-ensemble",
        "gateway-grpc-ensemble",
        "gateway-http-engine",
        "gateway-grpc-engine",
    ]
    names = [gateway_model("m", w, both) for w in both]
    assert names == ["m", "m-grpc-ensemble", "m-http-engine", "m-grpc-engine"]


def test_every_way_is_a_gateway_model_calling_its_entry_over_its_transport() -> None:
    args = argparse.Namespace(
        transport=["http", "grpc"],
        entry=["ensemble", "tensorrt_llm"],
        release="latest",
        device="cpu",
        max_batch_size=8,
        guided=False,
        mixed_batching=True,
        text_env=None,
        workers=2,
        metrics_port=9,
        triton_keep_alive_s=0.0,
    )
    config = gateway_config({"m": Path("/models/m")}, args, grpc_port=7)
    assert config["limits"]["triton_keep_alive_s"] == 0
    models = {model["name"]: model for model in config["models"]}
    assert set(models) == {"m", "m-grpc-ensemble", "m-http-engine", "m-grpc-engine"}
    assert {name: model["entry"] for name, model in models.items()} == {
        "m": "ensemble",
        "m-grpc-ensemble": "ensemble",
        "m-http-engine": "tensorrt_llm",
        "m-grpc-engine": "tensorrt_llm",
    }
    over_grpc = {name for name, model in models.items() if model["transport"] == "grpc"}
    assert over_grpc == {"m-grpc-ensemble", "m-grpc-engine"}
    assert all(model["pipeline"] == "m" for model in models.values())


def test_a_direct_response_is_timed_only_when_it_carries_text() -> None:
    """The direct client times what the gateway sends an event for: responses with text."""
    from tritonclient.grpc import service_pb2

    from tests.benchmarks.gpu_clients import carries_text

    def response(text: bytes, first: str = "text_output") -> service_pb2.ModelInferResponse:
        message = service_pb2.ModelInferResponse()
        for name in (first, "num_output_tokens" if first == "text_output" else "text_output"):
            message.outputs.add(name=name)
            value = text if name == "text_output" else b"\x01\x00\x00\x00"
            raw = len(value).to_bytes(4, "little") + value if name == "text_output" else value
            message.raw_output_contents.append(raw)
        return message

    assert carries_text(response(b"word"))
    assert not carries_text(response(b""))
    assert carries_text(response(b" a", first="num_output_tokens"))
    assert not carries_text(response(b"", first="num_output_tokens"))
    assert not carries_text(service_pb2.ModelInferResponse())


def test_runs_one_after_another_reverse_their_order_every_repeat() -> None:
    targets = ["direct", "direct-counts", "gateway"]
    runs = schedule(targets, 2, side_by_side=False)
    assert runs == [
        (("direct", 0),), (("direct-counts", 0),), (("gateway", 0),),
        (("gateway", 1),), (("direct-counts", 1),), (("direct", 1),),
    ]  # fmt: skip


@pytest.mark.parametrize("count", [2, 3, 4, 5])
def test_every_target_runs_as_often_in_every_place_of_a_repeat(count: int) -> None:
    """A target always run between two others would take whatever the place adds (a run's
    leftovers, a drift within the level) as its own."""
    targets = [f"t{index}" for index in range(count)]
    runs = schedule(targets, 2 * count, side_by_side=False)
    places: dict[tuple[str, int], int] = {}
    for index, ((target, repeat),) in enumerate(runs):
        assert repeat == index // count
        places[target, index % count] = places.get((target, index % count), 0) + 1
    assert places == {(target, place): 2 for target in targets for place in range(count)}
    assert turn(targets, 1) == targets[::-1]


def test_side_by_side_every_target_runs_with_a_direct_run_of_its_own_repeat() -> None:
    """Each pair is a repeat of its own, so the report pairs each target with the direct run
    it shared the engine's steps with."""
    runs = schedule(["direct", "direct-counts", "gateway"], 2, side_by_side=True)
    assert runs == [
        (("direct", 0), ("direct-counts", 0)),
        (("direct", 1), ("gateway", 1)),
        (("direct", 2), ("gateway", 2)),
        (("direct", 3), ("direct-counts", 3)),
    ]


def test_the_direct_client_with_every_extra_sends_the_ensemble_what_the_gateway_sends() -> None:
    """``--direct greedy-counts-perf`` is the gateway's request to the latest ensemble for the
    benchmark's completion, tensor for tensor (but the seed's value, random in the gateway's):
    the comparison of the two measures the gateway's own path, nothing it asks of the engine."""
    import random
    from dataclasses import replace

    import msgspec

    from adapters.contract import GenerationRequest
    from adapters.triton.config import parse_model_config
    from adapters.triton.tensors import build_inputs, requested_outputs
    from adapters.triton.wire import wire_array
    from gateway.core.plan import Prompt
    from gateway.openai.protocol import CompletionRequest
    from gateway.openai.sampling import fan_out, sampling_params
    from gateway.settings import SamplingDefaults
    from tests.benchmarks.gpu_clients import PROMPT, direct_request, gateway_body
    from tests.support.stock_configs import stock

    ensemble = replace(parse_model_config(stock("ensemble")), decoupled=True, tokens_per_block=32)
    body = msgspec.convert(gateway_body("llama", 128), CompletionRequest)
    params = sampling_params(body, SamplingDefaults(), max_tokens=128, logprobs=False)
    (choice,) = fan_out([Prompt(PROMPT, 100)], 1, [params], random.Random(0))
    request = GenerationRequest("r", PROMPT, choice.params, stream=True, prompt_tokens=100)
    gateway = {t.name: (t.datatype, t.array.tolist()) for t in build_inputs(request, ensemble)}

    def sent(extras: tuple[str, ...]) -> tuple[dict[str, Any], list[str]]:
        message = direct_request("llama", 128, extras)
        tensors = {
            entry.name: (
                entry.datatype,
                wire_array(entry.datatype, raw, tuple(entry.shape)).tolist(),
            )
            for entry, raw in zip(message.inputs, message.raw_input_contents, strict=True)
        }
        return tensors, [output.name for output in message.outputs]

    tensors, outputs = sent(("greedy", "counts", "perf"))
    assert "seed" in gateway and gateway["seed"][0] == tensors["seed"][0]
    tensors["seed"] = gateway["seed"]
    assert tensors == gateway
    assert sorted(outputs) == sorted(requested_outputs(request, ensemble))
    assert sent(("counts",))[0] != gateway
