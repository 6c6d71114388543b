"""The tiny Llava's test sidecar (our ensemble and BLS, and the stock v0.19 BLS around our
models), test images, and transformers' greedy reference on the same image and text."""

from __future__ import annotations

import base64
import io
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from deploy.sidecar.render import render_files, write_repository
from deploy.sidecar.spec import Spec, parse_spec
from deploy.sidecar.supervisor import Sidecar
from deploy.sidecar.tritonbin import find_tritonserver
from tests.support.sidecars import QUICK_STOP
from tests.support.stock import STOCK_MODELS, fill_template

PIPELINE = "vis"
STOCK_BLS = "stock_bls"
BLOCK = 16


def vision_spec(model_dir: Path) -> Spec:
    """One pipeline over the tiny Llava: the v0.19 layout, blocks of 16 tokens, reuse on."""
    engine = {
        "kind": "torch",
        "model_dir": str(model_dir),
        "max_batch_size": 8,
        "tokens_per_block": BLOCK,
        "enable_kv_cache_reuse": True,
    }
    return parse_spec(
        {
            "models": [
                {
                    "name": PIPELINE,
                    "release": "v0.19",
                    "engine": engine,
                    "vision_model": str(model_dir),
                }
            ],
            "sidecars": [{"name": "vision", **QUICK_STOP}],
        }
    )


def _stock_bls(repository: Path, decoupled: bool) -> None:
    """The stock v0.19 BLS over our models: it calls ``preprocessing`` and ``postprocessing``
    by those names, so our two are served under them too."""
    for step in ("preprocessing", "postprocessing"):
        ours = repository / f"{PIPELINE}_{step}"
        shutil.copytree(ours, repository / step)
        config = repository / step / "config.pbtxt"
        text = re.sub(r'^name: "\w+"', f'name: "{step}"', config.read_text(), count=1, flags=re.M)
        config.write_text(text)
    target = repository / STOCK_BLS
    shutil.copytree(STOCK_MODELS / "v0.19.0" / "tensorrt_llm_bls", target)
    config = target / "config.pbtxt"
    mode = "True" if decoupled else "False"
    text = fill_template(
        config.read_text(),
        f"triton_max_batch_size:8,decoupled_mode:{mode},bls_instance_count:1,"
        f"accumulate_tokens:False,logits_datatype:TYPE_FP32,"
        f"tensorrt_llm_model_name:{PIPELINE}_tensorrt_llm,"
        f"multimodal_encoders_name:{PIPELINE}_multimodal_encoders",
    )
    config.write_text(re.sub(r'^name: "\w+"', f'name: "{STOCK_BLS}"', text, count=1, flags=re.M))


def vision_sidecar(model_dir: Path, workdir: Path) -> Sidecar:
    """A (not started) tritonserver serving the tiny Llava's pipeline and the stock BLS."""
    spec = vision_spec(model_dir)
    repository = write_repository(render_files(spec, spec.sidecars[0]), workdir / "repo")
    _stock_bls(repository, decoupled=True)
    return Sidecar(
        "vision",
        repository,
        find_tritonserver(),
        log_path=workdir / "tritonserver.log",
        max_restarts=0,
    )


def sample_image(seed: int, size: tuple[int, int] = (40, 48)) -> Any:
    """A deterministic RGB image of noise and stripes (PIL)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
    pixels[:: 4 + seed % 3] = (seed * 37) % 256
    return Image.fromarray(pixels)


def png_bytes(image: Any, kind: str = "PNG") -> bytes:
    """An image encoded as PNG (or JPEG, WEBP)."""
    buffer = io.BytesIO()
    image.save(buffer, format=kind)
    return buffer.getvalue()


def data_url(image: Any, kind: str = "PNG") -> str:
    """A ``data:`` URL of an image."""
    encoded = base64.b64encode(png_bytes(image, kind)).decode()
    return f"data:image/{kind.lower()};base64,{encoded}"


class Reference:
    """transformers' greedy generation of the tiny Llava. Pixel values go through float16, the
    type the stock contract gives them (``PIXEL_VALUES``, ``image_input``)."""

    def __init__(self, model_dir: Path) -> None:
        from transformers import AutoModelForImageTextToText, AutoProcessor

        self.processor = AutoProcessor.from_pretrained(model_dir)
        self.model = AutoModelForImageTextToText.from_pretrained(model_dir).eval()

    def prompt(self, messages: list[dict[str, Any]]) -> str:
        """The chat template's text of ``messages`` (content lists with image parts)."""
        text: str = self.processor.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        return text

    def generate(self, text: str, images: list[Any], max_new_tokens: int) -> str:
        """The greedy completion's text (special tokens skipped), up to the end token."""
        import torch

        inputs = self.processor(images=images or None, text=text, return_tensors="pt")
        if "pixel_values" in inputs:
            inputs["pixel_values"] = inputs["pixel_values"].half().float()
        with torch.no_grad():
            out = self.model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
        tokens = out[0, inputs["input_ids"].shape[1] :].tolist()
        eos = self.model.generation_config.eos_token_id
        tokens = tokens[: tokens.index(eos)] if eos in tokens else tokens
        decoded: str = self.processor.tokenizer.decode(tokens, skip_special_tokens=True)
        return decoded
