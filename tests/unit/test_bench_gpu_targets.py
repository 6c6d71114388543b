"""The GPU benchmark's targets: one gateway model per way to Triton (transport and entry), each
named after what tells it from the others."""

from __future__ import annotations

import argparse
from pathlib import Path

from tests.benchmarks.gpu_clients import (
    Way,
    gateway_model,
    gateway_targets,
    gateway_ways,
    schedule,
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
