"""LoRA adapters made with ``peft`` on a test model, and Hugging Face + PEFT reference outputs.

The adapters' weights are random but large enough to change what the model generates, and
rounded to float16 values, so the float16 wire format of ``lora_weights`` carries them exactly;
their scales (alpha/r) are powers of two for the same reason.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from tests.support.engine import reference

ALL_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class AdapterRecipe:
    rank: int
    alpha: int
    targets: Sequence[str]
    seed: int
    std: float = 0.25
    rslora: bool = False


RECIPES = {
    "lora-a": AdapterRecipe(rank=4, alpha=8, targets=ALL_MODULES, seed=1),
    "lora-b": AdapterRecipe(rank=2, alpha=2, targets=("q_proj", "v_proj", "down_proj"), seed=2),
}


def make_peft_adapter(model_dir: Path, out_dir: Path, recipe: AdapterRecipe) -> Path:
    """Save a PEFT LoRA adapter of ``recipe`` for the model in ``model_dir``."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = LoraConfig(
        r=recipe.rank,
        lora_alpha=recipe.alpha,
        target_modules=list(recipe.targets),
        lora_dropout=0.0,
        use_rslora=recipe.rslora,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # peft calls transformers' old names
        peft_model = get_peft_model(model, config)
    generator = torch.Generator().manual_seed(recipe.seed)
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_" in name:
                values = torch.randn(parameter.shape, generator=generator) * recipe.std
                parameter.copy_(values.half().float())
    peft_model.save_pretrained(out_dir)
    return out_dir


def peft_greedy(
    model_dir: Path, adapter_dir: Path | None, prompt: Sequence[int], max_new: int
) -> list[int]:
    """Greedy tokens of the base model with ``adapter_dir`` applied (none: the base model)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if adapter_dir is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            model = PeftModel.from_pretrained(model, adapter_dir)
    return reference(model.eval(), tuple(prompt), max_new)
