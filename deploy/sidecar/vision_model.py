"""The tiny deterministic Llava: a small CLIP vision tower and projector in front of the tiny
Llama, a tokenizer with an ``<image>`` token and a chat template that takes image parts, and
the Hugging Face processor files, so that ``transformers`` runs it as any Llava checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from deploy.sidecar.tiny import (
    ENDOFTEXT,
    IM_END,
    portable_tokenizer_config,
    tiny_llama_config,
    train_tokenizer,
    unprintable_token_ids,
)

IMAGE_TOKEN = "<image>"
TINY_VISION_NAME = "tiny-vision"
TINY_VISION_FORMAT_VERSION = 1
IMAGE_SIZE = 32
PATCH_SIZE = 8
IMAGE_TOKENS = (IMAGE_SIZE // PATCH_SIZE) ** 2
"""Image tokens per image: one per patch (the class token is dropped, Llava's default)."""

VISION_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message.role + '\\n' -}}"
    "{%- if message.content is string -%}{{- message.content -}}"
    "{%- else -%}{%- for part in message.content -%}"
    "{%- if part.type == 'image' or part.type == 'image_url' -%}{{- '<image>' -}}"
    "{%- elif part.type == 'text' -%}{{- part.text -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def _seeded(model: Any, seed: int) -> None:
    """Every weight drawn from one seeded generator, in name order (norms 1, biases 0)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if "norm" in name and name.endswith("weight"):
                param.fill_(1.0)
            elif name.endswith("bias"):
                param.zero_()
            else:
                scale = 0.5 if "language_model" in name or name.startswith("lm_head") else 0.2
                param.copy_(torch.randn(param.shape, generator=generator) * scale)


def _llava(vocab_size: int, image_id: int, eos_id: int, pad_id: int, seed: int) -> Any:
    from transformers import (
        CLIPVisionConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
    )

    text = tiny_llama_config(vocab_size, eos_id, pad_id)
    vision = CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=IMAGE_SIZE,
        patch_size=PATCH_SIZE,
        projection_dim=32,
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=image_id,
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
        projector_hidden_act="gelu",
        image_seq_length=IMAGE_TOKENS,
        tie_word_embeddings=False,
    )
    model = LlavaForConditionalGeneration(config)
    _seeded(model, seed)
    return model.eval()


def build_tiny_vision_model(path: Path, *, seed: int = 0) -> Path:
    """Write the tiny Llava (weights, tokenizer, processor) into ``path``."""
    from transformers import GenerationConfig, LlavaProcessor
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    tokenizer.chat_template = VISION_CHAT_TEMPLATE
    image_id = tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    eos_id = tokenizer.convert_tokens_to_ids(IM_END)
    pad_id = tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    model = _llava(len(tokenizer), image_id, eos_id, pad_id, seed)
    suppressed = sorted({*unprintable_token_ids(tokenizer), image_id})
    model.generation_config = GenerationConfig(
        eos_token_id=eos_id, pad_token_id=pad_id, do_sample=False, suppress_tokens=suppressed
    )
    model.save_pretrained(path, safe_serialization=True)
    images = CLIPImageProcessorPil(
        size={"shortest_edge": IMAGE_SIZE},
        crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
    )
    processor = LlavaProcessor(
        image_processor=images,
        tokenizer=tokenizer,
        patch_size=PATCH_SIZE,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        chat_template=VISION_CHAT_TEMPLATE,
    )
    processor.save_pretrained(path)
    tokenizer.save_pretrained(path)
    portable_tokenizer_config(path, model_max_length=4096)
    return path
