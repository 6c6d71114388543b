"""``triton-gateway init``: a runnable configuration to start from, on a machine without a GPU.

It writes a deploy spec (one sidecar serving SmolLM2-135M-Instruct on the PyTorch engine), the
gateway settings (two tenants with their limits, an admin key, a LoRA adapter) and that adapter:
a PEFT folder with small random weights for SmolLM2's attention, which shows how adapters are
named, listed, limited and applied (it nudges the answers, it teaches the model nothing). Keys
are printed once; only their SHA-256 digests are written.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gateway.tenancy.service import digest, new_key

MODEL = "smollm2"
ADAPTER = "smollm2-example"
ADAPTER_FOLDER = "adapters/smollm2-example"

DEPLOY_YAML = """\
# The sidecar that `triton-gateway serve` starts and supervises: one tritonserver, one pipeline.
models:
  - name: {model}
    release: latest             # TensorRT-LLM 1.x's model configs (v0.8, v0.11, v0.19 also work)
    engine:
      kind: torch               # the project's PyTorch engine; `tensorrtllm` for real engines
      model_dir: smollm2        # built-in name: SmolLM2-135M-Instruct, converted once
      max_seq_len: 2048
      enable_kv_cache_reuse: true # shared prefixes (system prompts, chat history) prefill once
      # device: auto (the default) is CUDA where the machine has it, else the CPU.
"""

GATEWAY_YAML = """\
# triton-gateway serve --config {folder}/gateway.yaml
sidecars: {{spec: deploy.yaml}}
models:
  - name: {model}
    pipeline: {model}           # the pipeline of deploy.yaml; Triton's {model}_ensemble
    adapters:
      - {{name: {adapter}, path: {adapter_folder}}}
server: {{host: 127.0.0.1, port: 8000}}
tenancy:
  admin_key_sha256: {admin}     # opens /admin, the LoRA endpoints and /metrics
  tenants:
    - name: team-a
      models: ["{model}"]
      adapters: ["*"]           # every adapter of its models
      requests_per_minute: 120
      tokens_per_minute: 40000
      max_concurrency: 4
      max_tokens: 256           # per choice; also the default when a request sends none
    - name: team-b
      models: ["{model}"]
      adapters: []              # the base model only: the adapter answers 404
      requests_per_minute: 20
      tokens_per_minute: 5000
  keys:
    - {{tenant: team-a, sha256: {team_a}, name: starter}}
    - {{tenant: team-b, sha256: {team_b}, name: starter}}
  # A redis-server the gateway runs itself, kept in tenancy.rdb beside this file: the admin
  # API's tenant and key changes survive a restart. It is also what a file naming no store
  # gets. `kind: redis` with a `url` shares one Redis between several gateways; `kind: memory`
  # keeps nothing and the admin API cannot change it.
  store: {{kind: embedded, path: tenancy.rdb}}
"""


@dataclass(frozen=True)
class StarterKeys:
    """The keys written into the settings, shown once."""

    admin: str
    team_a: str
    team_b: str


def write_starter(folder: Path, model_dir: Path) -> StarterKeys:
    """Write ``deploy.yaml``, ``gateway.yaml`` and the example adapter into ``folder``.

    ``model_dir`` is SmolLM2's Hugging Face folder, read for the adapter's shapes. Refuses a
    folder that already holds a configuration.
    """
    targets = [folder / "gateway.yaml", folder / "deploy.yaml"]
    existing = [str(path) for path in targets if path.exists()]
    if existing:
        raise FileExistsError(f"already there, not overwritten: {', '.join(existing)}")
    keys = StarterKeys(admin=new_key(), team_a=new_key(), team_b=new_key())
    write_example_adapter(folder / ADAPTER_FOLDER, model_dir)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "deploy.yaml").write_text(DEPLOY_YAML.format(model=MODEL))
    (folder / "gateway.yaml").write_text(
        GATEWAY_YAML.format(
            folder=folder,
            model=MODEL,
            adapter=ADAPTER,
            adapter_folder=ADAPTER_FOLDER,
            admin=digest(keys.admin),
            team_a=digest(keys.team_a),
            team_b=digest(keys.team_b),
        )
    )
    return keys


def write_example_adapter(out: Path, model_dir: Path, rank: int = 8, seed: int = 0) -> Path:
    """A PEFT LoRA folder on ``q_proj`` and ``v_proj`` of every layer, small random weights."""
    from safetensors.numpy import save_file

    config = json.loads((model_dir / "config.json").read_text())
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or hidden // heads)
    kv_out = int(config.get("num_key_value_heads", heads)) * head_dim
    rng = np.random.default_rng(seed)
    tensors = {}
    for layer in range(int(config["num_hidden_layers"])):
        for module, width in (("q_proj", heads * head_dim), ("v_proj", kv_out)):
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            a = rng.normal(0.0, 0.02, (rank, hidden))
            b = rng.normal(0.0, 0.02, (width, rank))
            tensors[f"{prefix}.lora_A.weight"] = a.astype(np.float16)
            tensors[f"{prefix}.lora_B.weight"] = b.astype(np.float16)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": 2 * rank,
        "target_modules": ["q_proj", "v_proj"],
        "lora_dropout": 0.0,
        "bias": "none",
        "base_model_name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct",
    }
    (out / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2) + "\n")
    return out
