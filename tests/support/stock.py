"""Model repositories of the stock TensorRT-LLM models of a release, our engine as `tensorrt_llm`.

Filled the way a user fills them: `fill_template.py` with only the values the backend's own
examples set for that release (README at v0.19.0, plus the two guided-decoding values of its
`docs/guided_decoding.md` and a `max_beam_width`; `docs/llama.md` before, whose README has
tables only), everything else left as shipped. The one change to drop the torch engine in is
`tensorrt_llm`'s backend (`python`, with our engine's `model.py` in `tensorrt_llm/1/`). Given a
text environment, the models that import no torch when they load (the preprocessing and
postprocessing; the BLS before v0.19) run in it, as a deployment's `text_python_env` runs them:
their stubs then start without importing torch (transformers imports it whenever it can).
"""

from __future__ import annotations

import re
import shutil
import string
from dataclasses import dataclass
from pathlib import Path

from deploy.sidecar.render import BACKENDS
from deploy.sidecar.supervisor import Sidecar
from deploy.sidecar.tritonbin import find_tritonserver
from tests.support import REPO

STOCK_MODELS = REPO.parent / "shared" / "reference" / "stock-models"
FILL_DEFAULTS = {"max_queue_size": "0", "max_queue_delay_microseconds": "0"}
# v0.11.0's BLS declares dataclass fields with numpy defaults, which Python 3.11 refuses.
BLS_LOADS = {"v0.8": True, "v0.11": False, "v0.19": True}
NO_BLS_REASON = (
    "the stock v0.11.0 BLS does not load on Python 3.11: its dataclasses use numpy arrays as "
    "field defaults (ValueError: mutable default)"
)
NOSEED_ENSEMBLE = "ensemble_noseed"
_TOP_LEVEL_TORCH = re.compile(r"^(?:import torch|from torch)\b", re.M)
PYTHON_MODELS = ("preprocessing", "postprocessing", "tensorrt_llm_bls")
_EXECUTION_ENV = '\nparameters: {{ key: "EXECUTION_ENV_PATH" value: {{ string_value: "{}" }} }}\n'
MAX_BEAM_WIDTH = 4
"""v0.19's engine searches up to this many beams: its README leaves ``max_beam_width`` unset
(width 1), which a deployment that searches beams sets. The older examples set it to 1."""


def _examples(release: str, decoupled: bool, tokenizer: str, engine: str) -> dict[str, str]:
    """The `fill_template.py` arguments of the release's own examples, per model."""
    mode = "True" if decoupled else "False"
    if release == "v0.19":  # README.md, "Prepare the model repository"
        return {
            "ensemble": "triton_max_batch_size:4,logits_datatype:TYPE_FP32",
            "preprocessing": f"tokenizer_dir:{tokenizer},triton_max_batch_size:4,"
            "preprocessing_instance_count:1",
            "tensorrt_llm": f"triton_backend:python,triton_max_batch_size:4,decoupled_mode:{mode},"
            f"engine_dir:{engine},max_queue_delay_microseconds:0,max_beam_width:{MAX_BEAM_WIDTH},"
            "batching_strategy:inflight_fused_batching,max_queue_size:0,"
            "encoder_input_features_data_type:TYPE_FP16,logits_datatype:TYPE_FP32,"
            f"tokenizer_dir:{tokenizer},guided_decoding_backend:xgrammar",
            "postprocessing": f"tokenizer_dir:{tokenizer},triton_max_batch_size:4,"
            "postprocessing_instance_count:1",
            "tensorrt_llm_bls": f"triton_max_batch_size:4,decoupled_mode:{mode},"
            "bls_instance_count:1,logits_datatype:TYPE_FP32",
        }
    # docs/llama.md: streaming (decoupled) and non-streaming variants.
    tokenizer_type = ",tokenizer_type:auto" if release == "v0.8" else ""
    strategy = "inflight_batching" if decoupled or release == "v0.8" else "inflight_fused_batching"
    backend = "triton_backend:python," if release == "v0.11" else ""
    delay = "600" if release == "v0.8" else "0"
    return {
        "preprocessing": f"tokenizer_dir:{tokenizer}{tokenizer_type},triton_max_batch_size:64,"
        "preprocessing_instance_count:1",
        "postprocessing": f"tokenizer_dir:{tokenizer}{tokenizer_type},triton_max_batch_size:64,"
        "postprocessing_instance_count:1",
        "tensorrt_llm_bls": f"triton_max_batch_size:64,decoupled_mode:{mode},"
        f"bls_instance_count:1,accumulate_tokens:{mode}",
        "ensemble": "triton_max_batch_size:64",
        "tensorrt_llm": f"{backend}triton_max_batch_size:64,decoupled_mode:{mode},"
        f"max_beam_width:1,engine_dir:{engine},max_tokens_in_paged_kv_cache:2560,"
        "max_attention_window_size:2560,kv_cache_free_gpu_mem_fraction:0.5,"
        "exclude_input_in_output:True,enable_kv_cache_reuse:False,"
        f"batching_strategy:{strategy},max_queue_delay_microseconds:{delay}",
    }


def fill_template(text: str, arguments: str) -> str:
    """What `tools/fill_template.py` does with ``k1:v1,k2:v2``: every key must occur in the
    file; placeholders not given stay as they are."""
    values = dict(FILL_DEFAULTS)
    for pair in arguments.split(","):
        key, value = pair.split(":", 1)
        assert key in text, f"key '{key}' does not exist in the file"
        values[key] = value
    return string.Template(text).safe_substitute(values)


def _without_seed(ensemble: str) -> str:
    """The ensemble as a deployment that never exposed a seed: no `random_seed` input."""
    text = re.sub(r'\{\s*name: "random_seed"[^}]*\},\s*', "", ensemble, count=1)
    text = re.sub(r'input_map\s*\{\s*key: "random_seed"\s*value: "random_seed"\s*\}\s*', "", text)
    assert "random_seed" not in text
    return text.replace('name: "ensemble"', f'name: "{NOSEED_ENSEMBLE}"', 1)


def imports_torch(folder: Path) -> bool:
    """Whether a stock model imports torch when it loads: at the top level of one of its files
    (v0.19's preprocessing imports it only inside the methods of its vision preprocessor,
    which multimodal models use)."""
    return any(_TOP_LEVEL_TORCH.search(path.read_text()) for path in folder.rglob("*.py"))


def write_stock_repository(
    release: str,
    decoupled: bool,
    model_dir: Path,
    out: Path,
    engine: Path = BACKENDS / "tensorrt_llm" / "model.py",
    text_env: Path | None = None,
) -> list[str]:
    """The release's stock models filled as its examples fill them, ``engine`` as the
    ``tensorrt_llm`` model's ``model.py``, the Python models that need no torch in
    ``text_env`` where one is given; returns the model names."""
    source = STOCK_MODELS / f"{release}.0"
    examples = _examples(release, decoupled, str(model_dir), str(model_dir))
    names = [name for name in examples if name != "tensorrt_llm_bls" or BLS_LOADS[release]]
    for name in names:
        shutil.copytree(source / name, out / name)
        config = out / name / "config.pbtxt"
        text = fill_template(config.read_text(), examples[name])
        if name == "tensorrt_llm":
            text = re.sub(r'^backend: "\w+"', 'backend: "python"', text, count=1, flags=re.M)
            (out / name / "1").mkdir()
            shutil.copy(engine, out / name / "1" / "model.py")
        if text_env is not None and name in PYTHON_MODELS and not imports_torch(out / name):
            text += _EXECUTION_ENV.format(text_env)
        config.write_text(text)
        if name == "ensemble":
            # The shipped folder holds an empty version directory that a copy of it may lack.
            (out / name / "1").mkdir(exist_ok=True)
            (out / NOSEED_ENSEMBLE / "1").mkdir(parents=True)
            (out / NOSEED_ENSEMBLE / "config.pbtxt").write_text(_without_seed(text))
    return names


@dataclass(frozen=True)
class StockStack:
    """A running tritonserver over one release's stock models."""

    release: str
    decoupled: bool
    sidecar: Sidecar

    @property
    def has_bls(self) -> bool:
        """Whether the release's stock BLS is deployed."""
        return BLS_LOADS[self.release]


def start_stock_sidecar(
    release: str,
    decoupled: bool,
    model_dir: Path,
    workdir: Path,
    engine: Path = BACKENDS / "tensorrt_llm" / "model.py",
    text_env: Path | None = None,
) -> Sidecar:
    """Start tritonserver on the release's stock repository (stopped by the caller)."""
    repository = workdir / "repo"
    write_stock_repository(release, decoupled, model_dir, repository, engine, text_env)
    sidecar = Sidecar(
        f"stock{release.replace('.', '')}",
        repository,
        find_tritonserver(),
        log_path=workdir / "tritonserver.log",
        max_restarts=0,
        stop_grace_s=0,
    )
    sidecar.start()
    return sidecar
