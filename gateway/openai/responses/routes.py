"""``/v1/responses``: create a response (whole or streamed) as a chat completion over the
conversation it continues; retrieve, delete and list the input of a stored one. A stored
response is its tenant's: any other caller gets the 404 of a response that does not exist."""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from litestar import Request, delete, get
from litestar.datastructures import State

from gateway.catalog.registry import ServedModel
from gateway.core.plan import Plan
from gateway.errors import ResourceNotFoundError
from gateway.openai.bounds import Bounds, check_chat_bounds
from gateway.openai.chat.plan import plan_chat
from gateway.openai.pipeline import Endpoint, route
from gateway.openai.protocol import ChatCompletion
from gateway.openai.responses.conversation import chat_messages
from gateway.openai.responses.protocol import (
    DeletedResponse,
    InputItemList,
    Item,
    ResponseObject,
    ResponseReasoning,
    ResponsesRequest,
    ResponseText,
    StoredResponse,
)
from gateway.openai.responses.shape import (
    draft_now,
    item_id,
    response_events,
    whole_response,
)
from gateway.openai.responses.translate import (
    chat_request,
    input_items,
    refuse_unsupported,
    responses_params,
)
from gateway.openai.sampling import given
from gateway.openai.shaping import chat_chunks, chat_completion
from gateway.tenancy import TenantPolicy
from gateway.tenancy.responses_store import ResponseStore
from gateway.tenancy.service import Tenancy

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(StoredResponse)


async def stored(store: ResponseStore, tenant: str, response_id: str, param: str) -> StoredResponse:
    """The tenant's stored response; a 404 naming ``param`` when it has none by that id."""
    record = await store.get(tenant, response_id)
    if record is None:
        raise ResourceNotFoundError(
            f"Response with id {response_id!r} not found.", param=param, code="not_found"
        )
    return _decoder.decode(record)


def _draft(request: ResponsesRequest) -> ResponseObject:
    text = given(request.text)
    form = given(text.format) if text is not None else None
    reasoning = given(request.reasoning)
    choice = given(request.tool_choice)
    return draft_now(
        id=item_id("resp"),
        model=request.model,
        instructions=given(request.instructions),
        max_output_tokens=given(request.max_output_tokens),
        parallel_tool_calls=given(request.parallel_tool_calls) is not False,
        previous_response_id=given(request.previous_response_id),
        reasoning=ResponseReasoning(
            effort=reasoning.effort if reasoning else None,
            summary=reasoning.summary if reasoning else None,
        ),
        store=given(request.store) is not False,
        temperature=given(request.temperature),
        text=ResponseText(
            format=msgspec.to_builtins(form) if form is not None else {"type": "text"}
        ),
        tool_choice=msgspec.to_builtins(choice) if choice is not None else "auto",
        tools=given(request.tools) or [],
        top_p=given(request.top_p),
        truncation=given(request.truncation) or "disabled",
        user=given(request.user),
        metadata=given(request.metadata) or {},
    )


async def bind(
    tenancy: Tenancy, tenant: TenantPolicy, request: ResponsesRequest
) -> Endpoint[ResponsesRequest]:
    """The endpoint answering one caller's request: the conversation it continues read from
    the caller's stored responses, made into the chat request it runs as."""
    refuse_unsupported(request)
    history: list[Item] = []
    previous = given(request.previous_response_id)
    if previous is not None:
        before = await stored(tenancy.responses, tenant.name, previous, "previous_response_id")
        history = [*before.history, *before.input, *before.response.output]
    items = input_items(request)
    messages = chat_messages(given(request.instructions), history, items)
    chat = chat_request(request, messages, stream=bool(given(request.stream)))
    draft = _draft(request)

    async def keep(response: ResponseObject) -> None:
        if response.store:
            record = StoredResponse(response=response, input=items, history=history)
            await tenancy.responses.put(tenant.name, response.id, _encoder.encode(record))

    async def keep_whole(answer: msgspec.Struct) -> None:
        assert isinstance(answer, ResponseObject)
        await keep(answer)

    def bounds(_: ResponsesRequest, limits: Bounds) -> None:
        with responses_params():
            check_chat_bounds(chat, limits)

    async def planner(
        model: ServedModel, _: ResponsesRequest, *, max_tokens_cap: int | None
    ) -> Plan:
        with responses_params():
            return await plan_chat(model, chat, max_tokens_cap=max_tokens_cap)

    def whole(plan: Plan, results: Any, header: Any) -> ResponseObject:
        completion: ChatCompletion = chat_completion(plan, results, header)
        return whole_response(draft, completion)

    def chunks(plan: Plan, events: Any, header: Any) -> Any:
        return response_events(draft, chat_chunks(plan, events, header), keep)

    return Endpoint(
        operation="chat",
        schema=ResponsesRequest,
        bounds=bounds,
        planner=planner,
        id_prefix="resp",
        chunks=chunks,
        whole=whole,
        keep=keep_whole,
    )


def _unbound(*_: Any, **__: Any) -> Any:
    raise RuntimeError("the responses endpoint answers only once bound to its caller")


RESPONSES: Endpoint[ResponsesRequest] = Endpoint(
    operation="chat",
    schema=ResponsesRequest,
    bounds=_unbound,
    planner=_unbound,
    id_prefix="resp",
    chunks=_unbound,
    whole=_unbound,
    bind=bind,
)

create_response = route("/v1/responses", RESPONSES)
"""Answer a Responses API request, whole or as server-sent events."""


def _caller(request: Request[Any, Any, Any], state: State) -> tuple[Tenancy, TenantPolicy]:
    tenancy: Tenancy = state.runtime.tenancy
    return tenancy, tenancy.authenticate(request.headers)


@get("/v1/responses/{response_id:str}")
async def retrieve_response(
    response_id: str, request: Request[Any, Any, Any], state: State
) -> ResponseObject:
    """A stored response of the caller."""
    tenancy, tenant = _caller(request, state)
    return (await stored(tenancy.responses, tenant.name, response_id, "response_id")).response


@delete("/v1/responses/{response_id:str}", status_code=200)
async def delete_response(
    response_id: str, request: Request[Any, Any, Any], state: State
) -> DeletedResponse:
    """Forget a stored response of the caller; later turns cannot continue it."""
    tenancy, tenant = _caller(request, state)
    if not await tenancy.responses.delete(tenant.name, response_id):
        raise ResourceNotFoundError(
            f"Response with id {response_id!r} not found.", param="response_id", code="not_found"
        )
    return DeletedResponse(id=response_id)


@get("/v1/responses/{response_id:str}/input_items")
async def list_input_items(
    response_id: str,
    request: Request[Any, Any, Any],
    state: State,
    order: Literal["asc", "desc"] = "desc",
    limit: int = 20,
    after: str | None = None,
) -> InputItemList:
    """The input items of a stored response of the caller (this turn's), newest first unless
    ``order=asc``, ``limit`` at a time after the item ``after``."""
    tenancy, tenant = _caller(request, state)
    record = await stored(tenancy.responses, tenant.name, response_id, "response_id")
    return page_of(record.input, order, limit, after)


def page_of(items: list[Item], order: str, limit: int, after: str | None) -> InputItemList:
    """One page of ``items``: newest first unless ``order`` is ``asc``, at most ``limit``
    (1 to 100), starting after the item ``after``."""
    ordered = list(items) if order == "asc" else list(reversed(items))
    if after is not None:
        ids = [item.id for item in ordered]
        ordered = ordered[ids.index(after) + 1 :] if after in ids else []
    page = ordered[: max(1, min(limit, 100))]
    return InputItemList(
        data=page,
        first_id=page[0].id if page else None,
        last_id=page[-1].id if page else None,
        has_more=len(ordered) > len(page),
    )


ROUTES = [create_response, retrieve_response, delete_response, list_input_items]
