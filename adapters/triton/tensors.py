"""Translation of a neutral generation request into the Triton input tensors a model declares."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from adapters.contract import GenerationRequest, Guide, InvalidRequest, SamplingParams
from adapters.triton.config import REUSED_BLOCKS, ModelInputs, TensorSpec
from adapters.triton.images import check_images, image_urls
from adapters.triton.lora_tensors import lora_inputs
from adapters.triton.wire import Array, WireTensor, flag, scalar, text

# Sampling field -> candidate input names, newest first (older releases: min_length, random_seed).
_SEED_INPUTS = ("seed", "random_seed")
_SAMPLING_INPUTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("temperature", ("temperature",)),
    ("top_p", ("top_p",)),
    ("top_k", ("top_k",)),
    ("presence_penalty", ("presence_penalty",)),
    ("frequency_penalty", ("frequency_penalty",)),
    ("repetition_penalty", ("repetition_penalty",)),
    ("min_tokens", ("min_tokens", "min_length")),
)
# The engine's own names where the ensemble and BLS rename them.
_ENGINE_SAMPLING_INPUTS = tuple(
    (
        field_name,
        tuple({"top_k": "runtime_top_k", "top_p": "runtime_top_p"}.get(n, n) for n in names),
    )
    for field_name, names in _SAMPLING_INPUTS
)


def first_input(model: ModelInputs, names: Sequence[str]) -> TensorSpec | None:
    """The first of ``names`` the model declares and passes on (new name first, then the old
    one)."""
    for name in names:
        if name in model.accepted:
            return model.inputs[name]
    return None


def streams(request: GenerationRequest, model: ModelInputs) -> bool:
    """Whether the request is sent as streaming: a non-decoupled model answers once, and so
    does a context-only request (its first token)."""
    if request.phase == "context_only":
        return False
    return request.stream and model.decoupled and model.stream_input in model.accepted


def counts_prompt(request: GenerationRequest, model: ModelInputs) -> bool:
    """Whether the engine is asked for ``num_input_tokens``: where the model reports it and the
    caller has no exact count of its own. Every response would carry it (two tensors a streamed
    token instead of one, through the engine, the ensemble and Triton's frontend)."""
    if not model.reports_input_tokens or model.is_engine:
        return False
    return request.prompt_tokens is None or bool(request.images)


def build_inputs(
    request: GenerationRequest, model: ModelInputs, *, lora_weights: bool = False
) -> list[WireTensor]:
    """The input tensors for ``request``, using only inputs that ``model`` declares.

    Raises ``InvalidRequest`` naming the parameter when the user set something the model
    cannot honour. ``lora_weights`` adds the adapter's weights and config to its task id.
    """
    params = request.params
    if request.images:
        check_images(model)
    if model.is_engine:
        tensors = _engine_prompt(request, model)
        sampling = _ENGINE_SAMPLING_INPUTS
    else:
        tensors = [
            WireTensor("text_input", "BYTES", [[request.prompt.encode()]]),
            scalar(model.inputs.get("max_tokens"), "max_tokens", params.max_tokens, "INT32"),
        ]
        sampling = _SAMPLING_INPUTS
        if request.images:
            tensors.append(WireTensor("image_url_input", "BYTES", image_urls(request.images)))
    tensors.extend(_sampling(params, model, sampling))
    tensors.extend(_seed(params, model))
    if params.stop:
        tensors.append(_stop_words(request, model))
    if params.logprobs and not model.supports_logprobs:
        raise InvalidRequest("this model does not return log probabilities", param="logprobs")
    # The engine's ids count its tokens; the text entries count by log probs where they must.
    counts_by_logprobs = model.counts_by_logprobs and not model.is_engine
    if params.logprobs or counts_by_logprobs:
        tensors.append(flag("return_log_probs", True))
    tensors.extend(_flags(request, model))
    if params.guide is not None:
        tensors.extend(guide_inputs(params.guide, model))
    if request.lora is not None:
        tensors.extend(lora_inputs(request.lora, model, with_weights=lora_weights))
    if request.cache_salt is not None:
        tensors.extend(_cache_salt(request.cache_salt, model))
    if request.phase is not None or request.context_phase_params is not None:
        tensors.extend(phase_inputs(request, model))
    return [tensor.unbatched() for tensor in tensors] if model.max_batch_size == 0 else tensors


CONTEXT_PHASE_PARAMS = "context_phase_params"
"""The handoff tensor: an output of a context-only request, an input of a generation-only one."""


def phase_inputs(request: GenerationRequest, model: ModelInputs) -> list[WireTensor]:
    """The inputs of one phase of a disaggregated request (the phase itself travels as the
    ``request_type`` request parameter): ``context_phase_params`` for the generation phase.
    Refused where the model cannot split a request, or the request cannot be split."""
    if not model.is_engine or CONTEXT_PHASE_PARAMS not in model.accepted:
        raise InvalidRequest(
            "this model does not serve disaggregated requests",
            param="model",
            detail=f"Triton model {model.name} is not a tensorrt_llm model with a "
            f"{CONTEXT_PHASE_PARAMS} input (TensorRT-LLM v0.19 and later have it)",
        )
    if request.params.beam is not None:
        raise InvalidRequest(
            "beam search cannot be split between a context and a generation engine",
            param=request.params.beam.param,
        )
    handoff = request.context_phase_params
    if (request.phase == "generation_only") != (handoff is not None):
        raise InvalidRequest(
            "a generation-only request needs the context phase's handoff, and only it takes one",
            param="model",
            detail=f"phase {request.phase} with {0 if handoff is None else len(handoff)} bytes",
        )
    if handoff is None:
        return []
    return [WireTensor(CONTEXT_PHASE_PARAMS, "UINT8", np.frombuffer(handoff, np.uint8)[None, :])]


def _cache_salt(salt: int, model: ModelInputs) -> list[WireTensor]:
    """``cache_salt_id``, or nothing where the engine keeps no cache to share; a model that
    reuses cached prompts but cannot take a salt would share them across scopes."""
    if model.salts_kv_cache:
        return [WireTensor("cache_salt_id", "UINT64", [[salt]])]
    if not model.reuses_kv_cache:
        return []
    raise InvalidRequest(UNSALTED_REFUSAL, param="model", detail=UNSALTED.format(model=model.name))


UNSALTED_REFUSAL = (
    "This model shares its cached prompts across tenants and is not configured to keep them "
    "apart, so it serves no tenant's scoped requests; ask the operator to configure it."
)
"""What a tenant is told; the operator's log has ``UNSALTED``, which names the Triton model."""
UNSALTED = (
    "model {model} reuses cached prompts across requests but its config declares no "
    "cache_salt_id input, so it cannot keep one tenant's cached prompts from another's; the "
    "operator can turn enable_kv_cache_reuse off, deploy configs that declare cache_salt_id, or "
    "set shared_kv_cache on the model to let its tenants share one cache"
)


def _sampling(
    params: SamplingParams, model: ModelInputs, table: tuple[tuple[str, tuple[str, ...]], ...]
) -> list[WireTensor]:
    """The sampling inputs. A greedy request is also sent as ``top_k = 1`` wherever the model
    takes ``top_k``: every release passes that on, while some drop ``temperature``."""
    greedy = _greedy(params)
    tensors = []
    for field_name, names in table:
        value = getattr(params, field_name)
        if field_name == "top_k" and greedy and first_input(model, names) is not None:
            value = 1
        if value is None:
            continue
        spec = first_input(model, names)
        if spec is not None:
            tensors.append(scalar(spec, field_name, value))
        elif field_name not in params.defaulted and not _honoured_unsent(
            field_name, value, model, greedy, table
        ):
            raise _unsupported(field_name, model, names)
    return tensors


def _greedy(params: SamplingParams) -> bool:
    return params.temperature == 0 or params.top_k == 1


def _honoured_unsent(
    field_name: str,
    value: float,
    model: ModelInputs,
    greedy: bool,
    table: tuple[tuple[str, tuple[str, ...]], ...],
) -> bool:
    """Whether a temperature the model drops is served anyway: 0 by ``top_k = 1``, 1 by the
    engine's own default."""
    if field_name != "temperature" or not model.drops("temperature"):
        return False
    top_k = dict(table)["top_k"]
    return value == 1.0 or (greedy and first_input(model, top_k) is not None)


def _unsupported(field_name: str, model: ModelInputs, names: tuple[str, ...]) -> InvalidRequest:
    dropped = model.drops(*names)
    if dropped is None:
        return InvalidRequest(f"this model does not support '{field_name}'", param=field_name)
    return InvalidRequest(
        f"'{field_name}' is not supported by this model: leave it out (0 for greedy decoding).",
        param=field_name,
        detail=f"Triton model {model.name} declares the input '{dropped}' but does not pass it "
        "on to its engine (the stock tensorrt_llm_bls before TensorRT-LLM v0.13 drops it); serve "
        "the model through the ensemble or this project's BLS",
    )


def _engine_prompt(request: GenerationRequest, model: ModelInputs) -> list[WireTensor]:
    """Token ids, their count, the output budget, and the tokenizer's end and pad ids."""
    tokens = request.tokens
    if tokens is None or not request.prompt_ids:
        raise InvalidRequest(
            "This model takes a prompt of token ids, and the request has none.",
            param="prompt",
            detail=f"Triton model {model.name} takes token ids",
        )
    tensors = [
        WireTensor("input_ids", "INT32", [list(request.prompt_ids)]),
        WireTensor("input_lengths", "INT32", [[len(request.prompt_ids)]]),
        scalar(model.inputs.get("request_output_len"), "max_tokens", request.params.max_tokens),
    ]
    for name, value in (("end_id", tokens.end_id), ("pad_id", tokens.pad_id)):
        if value is not None and name in model.accepted:
            tensors.append(scalar(model.inputs[name], name, value))
    return tensors


def _stop_words(request: GenerationRequest, model: ModelInputs) -> WireTensor:
    """Stop sequences as text (``stop_words``), or as the engine's ``[1, 2, P]`` id lists."""
    stop = request.params.stop
    if "stop_words" in model.accepted:
        return WireTensor("stop_words", "BYTES", [[w.encode() for w in stop]])
    if "stop_words_list" not in model.accepted or request.tokens is None:
        raise InvalidRequest("this model does not support stop sequences", param="stop")
    return WireTensor("stop_words_list", "INT32", word_list(request.tokens.word_ids(stop)))


def word_list(words: Sequence[Sequence[int]]) -> Array:
    """TensorRT-LLM's ``[1, 2, P]`` word list: flat ids padded with 0, end offsets with -1."""
    flat = [token for word in words for token in word]
    width = max(1, len(flat))
    out = np.zeros((1, 2, width), dtype=np.int32)
    out[0, 1, :] = -1
    out[0, 0, : len(flat)] = flat
    out[0, 1, : len(words)] = np.cumsum([len(word) for word in words], dtype=np.int32)
    return out


def requested_outputs(request: GenerationRequest, model: ModelInputs) -> list[str]:
    """The outputs to ask for: text, counts the model reports, log probs when wanted."""
    if model.is_engine:
        names = ["output_ids", "sequence_length"]
        if request.params.logprobs and model.supports_logprobs:
            names.append("output_log_probs")
        if model.reports_cached_tokens:
            names.append(REUSED_BLOCKS)
        if request.phase == "context_only":
            names.append(CONTEXT_PHASE_PARAMS)
        return names
    names = ["text_output"]
    if model.reports_cached_tokens:
        names.append(REUSED_BLOCKS)
    if counts_prompt(request, model):
        names.append("num_input_tokens")
    if model.reports_output_tokens:
        names.append("num_output_tokens")
    if (request.params.logprobs and model.supports_logprobs) or model.counts_by_logprobs:
        names.append("output_log_probs")
    return names


def stop_request_inputs() -> list[WireTensor]:
    """The inputs of a stop request to ``tensorrt_llm`` (sent with the running request's id)."""
    return [
        flag("stop", True),
        WireTensor("input_ids", "INT32", np.array([[0]], dtype=np.int32)),
        WireTensor("input_lengths", "INT32", np.array([[0]], dtype=np.int32)),
        WireTensor("request_output_len", "INT32", np.array([[0]], dtype=np.int32)),
    ]


def guide_inputs(guide: Guide, model: ModelInputs) -> list[WireTensor]:
    """``guided_decoding_guide_type`` and ``guided_decoding_guide``; a model that cannot guide
    refuses the request, unless the guide is only a hint."""
    if not model.accepts_guides:
        if guide.optional:
            return []
        if "guided_decoding_guide_type" in model.accepted:
            why = (
                f"guided decoding is not enabled on the engine of Triton model {model.name} "
                "(tensorrt_llm parameter guided_decoding_backend: xgrammar, and "
                "xgrammar_tokenizer_info_path for the C++ backend)"
            )
        else:
            why = (
                f"Triton model {model.name} has no guided_decoding_guide_type input "
                "(TensorRT-LLM v0.19 and later have it)"
            )
        raise InvalidRequest(
            f"'{guide.param}' needs guided decoding, which this model does not support.",
            param=guide.param,
            detail=why,
        )
    tensors = [text("guided_decoding_guide_type", guide.guide_type)]
    if guide.guide is not None:
        tensors.append(text("guided_decoding_guide", guide.guide))
    return tensors


def _seed(params: SamplingParams, model: ModelInputs) -> list[WireTensor]:
    """The seed, where the model takes one; without it only a variation seed may be dropped."""
    if params.seed is None:
        return []
    spec = first_input(model, _SEED_INPUTS)
    if spec is not None:
        return [scalar(spec, "seed", params.seed)]
    if params.seed_origin == "client":
        raise InvalidRequest("this model does not support 'seed'", param="seed")
    if params.seed_origin == "choices" and not _greedy(params):
        raise InvalidRequest(
            "n > 1 is not supported by this model: it declares no seed input, so every choice "
            "would sample the same text",
            param="n",
        )
    return []


def _flags(request: GenerationRequest, model: ModelInputs) -> list[WireTensor]:
    flags = []
    streaming = streams(request, model)
    if model.stream_input in model.accepted:
        flags.append(flag(model.stream_input, streaming))
    if "exclude_input_in_output" in model.accepted and not streaming:
        # A streamed request never gets its prompt back (TensorRT-LLM's executor sends only new
        # tokens when streaming, whatever the flag says): one input fewer to send and read.
        flags.append(flag("exclude_input_in_output", True))
    if counts_prompt(request, model):
        flags.append(flag("return_num_input_tokens", True))
    if model.reports_output_tokens and not model.is_engine:
        flags.append(flag("return_num_output_tokens", True))
    if model.reports_cached_tokens and model.reuse_stats_input is not None:
        flags.append(flag(model.reuse_stats_input, True))
    return flags
