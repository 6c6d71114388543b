"""OpenAI wire schemas: request and response bodies as msgspec Structs, and ``given`` and
``first_given``, which read a field that may be absent (``UNSET``) or null."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import UNSET, Meta, Struct, UnsetType

# Requests: unknown fields are accepted and ignored; UNSET tells "absent" from an explicit null.

Temperature = Annotated[float, Meta(ge=0.0, le=2.0)]
Probability = Annotated[float, Meta(ge=0.0, le=1.0)]
Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]
PositiveInt = Annotated[int, Meta(ge=1)]
NonNegativeInt = Annotated[int, Meta(ge=0)]
Role = Literal["system", "developer", "user", "assistant", "tool"]


class StreamOptions(Struct, frozen=True):
    """``stream_options`` of a streaming request."""

    include_usage: bool | None = None


class ImageURL(Struct, frozen=True):
    """``image_url`` of an image part: a ``data:`` URL (or an http(s) URL where the model
    fetches them), and the ``detail`` the model is asked to look at it in."""

    url: str
    detail: str | UnsetType = UNSET


class ContentPart(Struct, frozen=True):
    """One element of an array ``content``: ``text``, or ``image_url`` for a vision model."""

    type: str
    text: str | UnsetType = UNSET
    image_url: ImageURL | str | UnsetType = UNSET


class FunctionCall(Struct, frozen=True, kw_only=True):
    """The function and its JSON arguments in a tool call."""

    name: str
    arguments: str


class ToolCall(Struct, frozen=True, kw_only=True):
    """One entry of ``message.tool_calls``."""

    id: str
    type: str = "function"
    function: FunctionCall


class ChatMessage(Struct, frozen=True):
    """One message of a conversation."""

    role: Role
    content: str | list[ContentPart] | None = None
    name: str | UnsetType = UNSET
    tool_calls: list[ToolCall] | UnsetType | None = UNSET
    tool_call_id: str | UnsetType = UNSET
    reasoning_content: str | UnsetType | None = UNSET
    """An earlier answer's reasoning, given back to templates that show it."""
    reasoning: str | UnsetType | None = UNSET
    """The same, under the name trtllm-serve and newer vLLM use."""


class FunctionDefinition(Struct, frozen=True, kw_only=True):
    """``tools[].function``: a function the model may call."""

    name: Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
    description: str | UnsetType | None = UNSET
    parameters: dict[str, Any] | UnsetType | None = UNSET
    strict: bool | UnsetType | None = UNSET


class Tool(Struct, frozen=True, kw_only=True):
    """One entry of ``tools``."""

    type: str
    function: FunctionDefinition | UnsetType = UNSET


class FunctionName(Struct, frozen=True):
    """The function a named ``tool_choice`` forces."""

    name: str


class NamedToolChoice(Struct, frozen=True, kw_only=True):
    """``tool_choice: {"type": "function", "function": {"name": ...}}``."""

    type: str
    function: FunctionName | UnsetType = UNSET


class JsonSchemaFormat(Struct, frozen=True, kw_only=True):
    """``response_format.json_schema``."""

    name: str | UnsetType = UNSET
    description: str | UnsetType | None = UNSET
    schema: dict[str, Any] | UnsetType | None = UNSET
    strict: bool | UnsetType | None = UNSET


class ResponseFormat(Struct, frozen=True, kw_only=True):
    """``response_format``: ``text``, ``json_object`` or ``json_schema``."""

    type: str
    json_schema: JsonSchemaFormat | UnsetType | None = UNSET


class SamplingFields(Struct, frozen=True, kw_only=True):
    """Fields shared by chat and text completions."""

    model: str
    max_tokens: PositiveInt | UnsetType | None = UNSET
    temperature: Temperature | UnsetType | None = UNSET
    top_p: Probability | UnsetType | None = UNSET
    seed: int | UnsetType | None = UNSET
    """TensorRT-LLM's seed is 64 bits: negative seeds are taken as their two's complement."""
    logit_bias: dict[str, float] | UnsetType | None = UNSET
    stop: str | list[str] | UnsetType | None = UNSET
    presence_penalty: Penalty | UnsetType | None = UNSET
    frequency_penalty: Penalty | UnsetType | None = UNSET
    n: PositiveInt | UnsetType | None = UNSET
    stream: bool | UnsetType | None = UNSET
    stream_options: StreamOptions | UnsetType | None = UNSET
    user: str | UnsetType | None = UNSET
    top_k: Annotated[int, Meta(ge=-1)] | UnsetType | None = UNSET
    min_p: Probability | UnsetType | None = UNSET
    repetition_penalty: Annotated[float, Meta(gt=0.0)] | UnsetType | None = UNSET
    min_tokens: NonNegativeInt | UnsetType | None = UNSET
    response_format: ResponseFormat | UnsetType | None = UNSET
    use_beam_search: bool | UnsetType | None = UNSET
    """vLLM's: the ``n`` choices are the best beams of one beam search."""
    length_penalty: float | UnsetType | None = UNSET
    """vLLM's: beams are scored ``cum_log_prob / generated ** length_penalty``."""
    early_stopping: bool | Literal["never"] | UnsetType | None = UNSET
    """vLLM's: stop once ``n`` beams ended (true), heuristically (false), or never early."""
    best_of: PositiveInt | UnsetType | None = UNSET
    """vLLM's and trtllm-serve's: with ``use_beam_search`` the beam width (at least ``n``)."""
    cache_salt: Annotated[str, Meta(min_length=1, max_length=256)] | UnsetType | None = UNSET
    """vLLM's: only requests with the same salt reuse each other's cached prompt blocks; here a
    narrower scope inside the tenant's KV-cache scope, never a way into another's."""
    priority: Annotated[int, Meta(ge=-100, le=100)] | UnsetType | None = UNSET
    """The class the request waits in when the model is full, higher first (llm-d's
    ``InferenceObjective``): at most the tenant's ``priority_class``, which it may only lower."""
    service_tier: Literal["auto", "default", "flex", "priority"] | UnsetType | None = UNSET
    """OpenAI's: ``flex`` waits one class below the tenant's when the model is full; the
    others keep the tenant's class (none raises it)."""
    request_type: Any | UnsetType = UNSET
    """TensorRT-LLM's phase of a disaggregated request: the gateway's to set, refused."""
    context_phase_params: Any | UnsetType = UNSET
    """A disaggregated request's handoff between engines: the gateway's to carry, refused."""
    disaggregated_params: Any | UnsetType = UNSET
    """trtllm-serve's field for the same handoff: refused."""


class ChatCompletionRequest(SamplingFields, frozen=True, kw_only=True):
    """Body of ``POST /v1/chat/completions``."""

    messages: Annotated[list[ChatMessage], Meta(min_length=1)]
    max_completion_tokens: PositiveInt | UnsetType | None = UNSET
    logprobs: bool | UnsetType | None = UNSET
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | UnsetType | None = UNSET
    tools: list[Tool] | UnsetType | None = UNSET
    tool_choice: str | NamedToolChoice | UnsetType | None = UNSET
    parallel_tool_calls: bool | UnsetType | None = UNSET
    functions: list[dict[str, Any]] | UnsetType | None = UNSET
    function_call: str | dict[str, Any] | UnsetType | None = UNSET
    reasoning_effort: str | UnsetType | None = UNSET
    """``none``, ``minimal``, ``low``, ``medium`` or ``high``: passed to chat templates that
    take it, and as ``enable_thinking`` (false for ``none``)."""


class CompletionRequest(SamplingFields, frozen=True, kw_only=True):
    """Body of ``POST /v1/completions``."""

    prompt: str | Annotated[list[Any], Meta(min_length=1)]
    """Text, a list of texts, token ids, or a list of token-id lists (``prompt_texts`` checks)."""
    echo: bool | UnsetType | None = UNSET
    logprobs: Annotated[int, Meta(ge=0, le=5)] | UnsetType | None = UNSET
    suffix: str | UnsetType | None = UNSET


# Responses: field order follows OpenAI's; UNSET fields are left out of the JSON.


class PromptTokensDetails(Struct, frozen=True):
    """What the prompt's tokens were: ``cached_tokens`` came from the engine's KV cache."""

    cached_tokens: int


class CompletionTokensDetails(Struct, frozen=True):
    """What the completion's tokens were: ``reasoning_tokens`` were the model's reasoning."""

    reasoning_tokens: int


class Usage(Struct, frozen=True):
    """Token counts of a whole request; ``prompt_tokens_details`` where the engine reports
    the prompt tokens it found cached, ``completion_tokens_details`` where the model reasons."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | UnsetType = UNSET
    completion_tokens_details: CompletionTokensDetails | UnsetType = UNSET


class TopLogprob(Struct, frozen=True):
    """An alternative token and its log probability."""

    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(Struct, frozen=True):
    """A generated token of a chat completion and its log probability."""

    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]


class ChatLogprobs(Struct, frozen=True):
    """``logprobs`` of a chat choice."""

    content: list[TokenLogprob] | None


class AssistantMessage(Struct, frozen=True, kw_only=True):
    """The generated message of a chat choice."""

    role: str = "assistant"
    content: str | None
    reasoning_content: str | UnsetType | None = UNSET
    """The model's reasoning, for a model with a reasoning format (vLLM's name)."""
    reasoning: str | UnsetType | None = UNSET
    """The same reasoning under the name trtllm-serve and newer vLLM use."""
    tool_calls: list[ToolCall] | UnsetType = UNSET


class FunctionCallDelta(Struct, frozen=True, kw_only=True):
    """What a streamed chunk adds to a tool call's function."""

    name: str | UnsetType = UNSET
    arguments: str | UnsetType = UNSET


class ToolCallDelta(Struct, frozen=True, kw_only=True):
    """What a streamed chunk adds to one tool call: id, type and name first, then arguments."""

    index: int
    id: str | UnsetType = UNSET
    type: str | UnsetType = UNSET
    function: FunctionCallDelta


class ChatChoice(Struct, frozen=True, kw_only=True):
    """One choice of a chat completion."""

    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None


class ChatCompletion(Struct, frozen=True, kw_only=True):
    """Answer of a non-streaming chat completion."""

    id: str
    object: str = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(Struct, frozen=True, kw_only=True):
    """What a streamed chunk adds to a chat choice."""

    role: str | UnsetType = UNSET
    content: str | UnsetType = UNSET
    reasoning_content: str | UnsetType | None = UNSET
    """More of the model's reasoning."""
    reasoning: str | UnsetType | None = UNSET
    """The same, under the name trtllm-serve and newer vLLM use."""
    tool_calls: list[ToolCallDelta] | UnsetType = UNSET


class ChatChunkChoice(Struct, frozen=True, kw_only=True):
    """One choice of a streamed chat chunk."""

    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(Struct, frozen=True, kw_only=True):
    """One event of a streamed chat completion."""

    id: str
    object: str = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | UnsetType | None = UNSET


class CompletionLogprobs(Struct, frozen=True, kw_only=True):
    """``logprobs`` of a text completion choice (legacy format)."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None = None
    text_offset: list[int]


class CompletionChoice(Struct, frozen=True, kw_only=True):
    """One choice of a text completion, whole or streamed."""

    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None


class Completion(Struct, frozen=True, kw_only=True):
    """Answer of a text completion, or one chunk of a streamed one."""

    id: str
    object: str = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | UnsetType | None = UNSET


class ModelCard(Struct, frozen=True, kw_only=True):
    """One entry of ``/v1/models``."""

    id: str
    object: str = "model"
    created: int
    owned_by: str
    max_model_len: int | UnsetType = UNSET
    root: str | UnsetType = UNSET
    """For a LoRA adapter: the folder it was loaded from."""
    parent: str | None = None
    """For a LoRA adapter: the base model it runs on."""
    input_modalities: list[str] | UnsetType = UNSET
    """What the model takes: ``["text"]``, or ``["text", "image"]`` for a vision model."""
    limits: dict[str, int] | UnsetType = UNSET
    """The size a request of the caller may have (``max_choices``, ``max_stop_sequences``...);
    a request over one is refused with a 400 naming the field."""


class ModelList(Struct, frozen=True, kw_only=True):
    """Answer of ``GET /v1/models``."""

    object: str = "list"
    data: list[ModelCard]
