"""Images in the torch engine and the pipeline's pure parts: prompt-table rows in place of
placeholder ids give transformers' Llava output, blocks are keyed by image content, the tiny
Llava is deterministic, placeholder ids follow TensorRT-LLM's layout, and a vision pipeline
renders its encoder and the ensemble's encoder step."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from deploy.sidecar.render import render_files
from deploy.sidecar.vision_model import IMAGE_TOKENS, build_tiny_vision_model
from deploy.triton.engine.checks import validate_request
from deploy.triton.engine.scheduler import Engine
from deploy.triton.engine.types import EngineConfig, EngineError, KvCacheConfig
from deploy.triton.engine.wire import content_extra_ids, parse_items
from deploy.triton.vision.placeholders import ImageCountError, expand
from deploy.triton.vision.settings import VisionSettings, read_settings
from tests.support.engine import make, run
from tests.support.vision import Reference, sample_image, vision_spec

MAX_NEW = 16


@pytest.fixture(scope="module")
def vision_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_vision_model(tmp_path_factory.mktemp("models") / "tiny-vision")


@pytest.fixture(scope="module")
def engine(vision_dir: Path) -> Iterator[Engine]:
    kv = KvCacheConfig(tokens_per_block=8)
    engine = Engine.from_config(EngineConfig(str(vision_dir), max_batch_size=4, kv_cache=kv))
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def encode(vision_dir: Path) -> Any:
    import torch

    from deploy.triton.vision.encoder import VisionEncoder
    from deploy.triton.vision.images import ImageProcessor

    encoder = VisionEncoder.load(str(vision_dir), torch.device("cpu"), torch.float32)
    processor = ImageProcessor(str(vision_dir))
    return lambda images: encoder.encode(processor.pixel_values(images))


def _request(reference: Reference, settings: VisionSettings, images: list[Any], table: Any) -> Any:
    content = [*({"type": "image"} for _ in images), {"type": "text", "text": "Describe."}]
    ids = reference.processor.tokenizer.encode(
        reference.prompt([{"role": "user", "content": content}])
    )
    prompt = tuple(expand(ids, len(images), settings))
    extra = content_extra_ids(np.array(prompt), table, settings.vocab_size)
    return make(prompt, MAX_NEW, prompt_table=table, extra_ids=extra)


@pytest.mark.parametrize("count", [1, 2])
def test_prompt_table_rows_give_transformers_output_and_reuse_by_image(
    vision_dir: Path, engine: Engine, encode: Any, count: int
) -> None:
    reference = Reference(vision_dir)
    settings = read_settings(vision_dir)
    assert settings is not None and settings.tokens_per_image == IMAGE_TOKENS
    images = [sample_image(20 + count + i) for i in range(count)]
    content = [*({"type": "image"} for _ in images), {"type": "text", "text": "Describe."}]
    expected = reference.generate(
        reference.prompt([{"role": "user", "content": content}]), images, MAX_NEW
    )
    first = run(engine, _request(reference, settings, images, encode(images)))
    tokenizer = reference.processor.tokenizer
    assert tokenizer.decode(first.tokens(), skip_special_tokens=True) == expected
    again = run(engine, _request(reference, settings, images, encode(images)))
    assert again.tokens() == first.tokens()
    assert again.final().blocks is not None and again.final().blocks.reused > 0
    other = [sample_image(40 + count), *images[1:]]
    moved = run(engine, _request(reference, settings, other, encode(other)))
    assert moved.final().blocks is not None and moved.final().blocks.reused == 0


def test_ids_beyond_the_table_are_refused(vision_dir: Path) -> None:
    settings = read_settings(vision_dir)
    assert settings is not None
    table = np.zeros((4, 64), np.float16)
    vocab = settings.vocab_size
    ok = make((1, vocab, vocab + 3), 4, prompt_table=table)
    assert validate_request(ok, vocab, 256, 4) == 4
    with pytest.raises(EngineError, match="rows of prompt_embedding_table"):
        validate_request(make((1, vocab + 4), 4, prompt_table=table), vocab, 256, 4)
    with pytest.raises(EngineError, match="outside the vocabulary"):
        validate_request(
            make(
                (1, vocab),
            ),
            vocab,
            256,
            4,
        )


def test_the_wire_table_is_cut_to_prompt_vocab_size_and_keys_blocks_by_content() -> None:
    table = np.arange(3 * 2 * 4, dtype=np.float16).reshape(1, 6, 4)
    inputs = {
        "input_ids": np.array([[5, 10, 11, 12]], np.int32),
        "request_output_len": np.array([[2]], np.int32),
        "prompt_embedding_table": table,
        "prompt_vocab_size": np.array([[3]], np.int32),
    }
    ((request, _),) = parse_items(inputs, id_prefix="r", exclude_input_default=False, vocab_size=10)
    assert request.prompt_table is not None and request.prompt_table.shape == (3, 4)
    assert request.extra_ids is not None
    assert request.extra_ids[0] == 0 and len(set(request.extra_ids[1:])) == 3
    changed = dict(inputs, prompt_embedding_table=table + 1)
    ((other, _),) = parse_items(changed, id_prefix="r", exclude_input_default=False, vocab_size=10)
    assert other.extra_ids is not None and other.extra_ids[1:] != request.extra_ids[1:]


def test_placeholders_follow_trtllm_layout() -> None:
    settings = VisionSettings(image_token_id=7, tokens_per_image=3, vocab_size=100)
    assert expand([1, 7, 2, 7], 2, settings) == [1, 100, 101, 102, 2, 103, 104, 105]
    with pytest.raises(ImageCountError, match="1 image token"):
        expand([1, 7], 2, settings)


def test_the_tiny_llava_is_deterministic(vision_dir: Path, tmp_path: Path) -> None:
    again = build_tiny_vision_model(tmp_path / "again")
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        digest = [hashlib.sha256((d / name).read_bytes()).hexdigest() for d in (vision_dir, again)]
        assert digest[0] == digest[1], name


def test_a_vision_pipeline_renders_its_encoder_and_the_ensemble_step(vision_dir: Path) -> None:
    spec = vision_spec(vision_dir)
    files = render_files(spec, spec.sidecars[0])
    encoder = files["vis_multimodal_encoders/config.pbtxt"]
    assert 'name: "vis_multimodal_encoders"' in encoder and str(vision_dir) in encoder
    assert "vis_multimodal_encoders/1/model.py" in files
    ensemble = files["vis_ensemble/config.pbtxt"]
    assert 'model_name: "vis_multimodal_encoders"' in ensemble
    assert 'value: "_PROMPT_EMBEDDING_TABLE"' in ensemble
    assert 'name: "image_url_input"' in ensemble
    bls = files["vis_tensorrt_llm_bls/config.pbtxt"]
    assert '"vis_multimodal_encoders"' in bls
    assert str(vision_dir) in files["vis_preprocessing/config.pbtxt"]


def test_client_extra_ids_are_combined_with_the_rows_they_key() -> None:
    """A client's own ``prompt_table_extra_ids`` salt the image rows' digests, never replace
    them: two different images sent with the same ids do not share KV blocks."""
    table = np.arange(2 * 4, dtype=np.float16).reshape(1, 2, 4)
    inputs = {
        "input_ids": np.array([[5, 10, 11, 6]], np.int32),
        "request_output_len": np.array([[2]], np.int32),
        "prompt_embedding_table": table,
        "prompt_table_extra_ids": np.array([[3, 42, 42, 0]], np.uint64),
    }

    def extra_ids(**changes: Any) -> tuple[int, ...]:
        parsed = parse_items(
            dict(inputs, **changes), id_prefix="r", exclude_input_default=False, vocab_size=10
        )
        ids = parsed[0][0].extra_ids
        assert ids is not None
        return ids

    same = extra_ids()
    assert same[0] == 3 and same[3] == 0
    assert 0 not in same[1:3] and same[1] != same[2]
    assert extra_ids() == same
    other = extra_ids(prompt_embedding_table=table + 1)
    assert other[1:3] != same[1:3] and other[0] == 3
    salted = extra_ids(prompt_table_extra_ids=np.array([[3, 43, 43, 0]], np.uint64))
    assert salted[1:3] != same[1:3]
