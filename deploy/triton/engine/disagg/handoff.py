"""The engine's side of disaggregated serving: a context-only request's blocks held for the
generation engine, and a generation-only request admitted with its prompt's blocks fetched from
the context engine instead of prefilled (a prefix it already caches is not fetched)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

from deploy.triton.engine.batch import SequenceState
from deploy.triton.engine.blocks import BlockTable, blocks_for, chain_hashes
from deploy.triton.engine.context import Submission
from deploy.triton.engine.disagg.phase import BadContextPhase, ContextPhaseParams, KvTransfer
from deploy.triton.engine.disagg.transfer import Handoffs, TransferServer, fetch_blocks
from deploy.triton.engine.kvstore import AdmittedBlocks, KVStore
from deploy.triton.engine.types import (
    EngineFinishReason,
    EngineRequest,
    OutputCallback,
    SequenceOutput,
)

# Logits that make the sampler pick the context phase's first token whatever its settings:
# finite, so penalties and temperature keep them ordered.
_UNCHOSEN = -1e30


@dataclass(frozen=True)
class Fetched:
    """For the engine thread: a generation-only request's blocks arrived, or why not."""

    request_id: str
    transfer: KvTransfer | None
    error: str | None


@dataclass(eq=False)
class _Fetching:
    entry: Submission
    admission: AdmittedBlocks
    cancelled: bool = False


@dataclass(frozen=True)
class Taken:
    """For the engine thread: a handed-off table whose blocks were sent, to release."""

    table: BlockTable


class Disaggregation:
    """Handoffs of one engine, in both directions. The engine thread calls everything; the
    transfer server and the fetching threads post a ``Taken`` or a ``Fetched`` to it."""

    def __init__(
        self, store: KVStore, timeout_s: float, post: Callable[[Taken | Fetched], None]
    ) -> None:
        self.store = store
        self.handoffs = Handoffs(timeout_s)
        self._post = post
        self._server: TransferServer | None = None
        self._lock = threading.Lock()
        self.transfers = 0
        self.transfer_ms = 0.0
        self._fetching: dict[str, _Fetching] = {}

    def hand_off(
        self, outputs: Sequence[tuple[SequenceState, SequenceOutput]], finished: list[SequenceState]
    ) -> tuple[list[tuple[SequenceState, SequenceOutput]], list[SequenceState]]:
        """A context-only request's first token is out: hold the tables of its sequences that
        stopped only for their one-token budget, their outputs carrying the handoff; the rest
        (an end id, a stop word: the answer is whole) go back to be released."""
        held = {id(seq) for seq in finished if seq.finish is EngineFinishReason.LENGTH}
        answered = []
        for seq, output in outputs:
            if id(seq) in held and output.finished:
                params = self._hold(seq.request, seq.table, seq.generated)
                output = replace(output, context_phase_params=params)
            answered.append((seq, output))
        return answered, [seq for seq in finished if id(seq) not in held]

    def _hold(self, request: EngineRequest, table: BlockTable, first: Sequence[int]) -> bytes:
        server = self._serve()
        self.store.manager.unreserve(table)
        prompt = len(request.input_ids)
        layout = self.store.pool.layout
        params = ContextPhaseParams(
            address=server.address,
            handoff_id=self.handoffs.hold(table, prompt, request.request_id),
            first_tokens=tuple(first),
            prompt_length=prompt,
            tokens_per_block=self.store.tokens_per_block,
            model_key=self.store.model_key,
            bytes_per_token=layout.bytes_per_token,
        )
        return params.encode()

    def _serve(self) -> TransferServer:
        if self._server is None:
            self._server = TransferServer(self.store.pool, self.handoffs, self._taken)
        return self._server

    def _taken(self, table: BlockTable, transfer: KvTransfer) -> None:
        self._count(transfer)
        self._post(Taken(table))

    def _count(self, transfer: KvTransfer) -> None:
        with self._lock:
            self.transfers += 1
            self.transfer_ms += transfer.ms

    def release(self, taken: Taken) -> None:
        """Release a table the generation engine took."""
        self.store.release(taken.table)

    def expire(self) -> bool:
        """Free the held tables nobody took in time; True if there were any."""
        expired = self.handoffs.expired()
        for table in expired:
            self.store.release(table)
        return bool(expired)

    def wait_s(self) -> float | None:
        """How long the engine thread may sleep before a held table expires."""
        return self.handoffs.next_deadline_s()

    def close(self) -> None:
        """Stop serving handoffs and free what is held."""
        if self._server is not None:
            self._server.close()

    def begin(self, entry: Submission) -> bool:
        """Admit a generation-only request: its cached prefix taken, room reserved for the
        rest, whose blocks a thread of its own fetches from the context engine (a ``Fetched``
        follows); False while the pool cannot hold it."""
        request = entry.request
        params = request.context_phase
        if params is None:
            raise BadContextPhase("a generation_only request needs context_phase_params")
        self._check(params, request)
        store = self.store
        prompt = request.input_ids
        total, per_sequence = store.worst_case(request, entry.max_new_tokens)
        table = BlockTable(root=store.root(request))
        matched: list[int] = []
        if store.manager.reuse:
            hashes = chain_hashes(table.root, prompt, store.tokens_per_block, request.extra_ids)
            matched = store.manager.match(hashes)
        missed = blocks_for(len(prompt), store.tokens_per_block) - len(matched)
        if not store.manager.admit(table, matched, total - len(matched), missed):
            return False
        store.grow(table, len(prompt) - table.length)
        self._fetching[request.request_id] = _Fetching(
            entry, AdmittedBlocks(table, len(matched), per_sequence)
        )
        blocks = table.blocks[len(matched) :]
        threading.Thread(
            target=self._fetch,
            args=(request.request_id, params, len(matched), blocks),
            name="kv-fetch",
            daemon=True,
        ).start()
        return True

    def _fetch(
        self, request_id: str, params: ContextPhaseParams, skip: int, blocks: list[int]
    ) -> None:
        """On a thread of its own: the blocks are the request's alone until it completes."""
        try:
            transfer = fetch_blocks(
                params.address, params.handoff_id, skip, self.store.pool, blocks
            )
        except Exception as exc:
            self._post(Fetched(request_id, None, str(exc)))
        else:
            self._post(Fetched(request_id, transfer, None))

    @property
    def fetching(self) -> int:
        """Generation-only requests whose blocks are on their way."""
        return len(self._fetching)

    def cancel(self, request_id: str) -> None:
        """Cancel a request whose blocks are on their way (it ends when they arrive), or free
        at once the blocks a context-only request holds for a generation engine, as
        TensorRT-LLM's executor frees a context-complete request it is asked to cancel."""
        fetching = self._fetching.get(request_id)
        if fetching is not None:
            fetching.cancelled = True
        for table in self.handoffs.drop(request_id):
            self.store.release(table)

    def complete(
        self, fetched: Fetched
    ) -> (
        tuple[Submission, AdmittedBlocks, KvTransfer | tuple[EngineFinishReason, str | None]] | None
    ):
        """A request's blocks arrived: its entry, its admission and the transfer; or, where it
        failed or was cancelled meanwhile (its blocks released), why it ends."""
        fetching = self._fetching.pop(fetched.request_id, None)
        if fetching is None:
            return None
        entry, admission = fetching.entry, fetching.admission
        if fetched.transfer is None or fetching.cancelled:
            self.store.release(admission.table)
            if fetching.cancelled:
                return entry, admission, (EngineFinishReason.CANCELLED, None)
            return entry, admission, (EngineFinishReason.ERROR, fetched.error)
        table, prompt = admission.table, entry.request.input_ids
        table.length = len(prompt)
        self.store.commit(table, prompt, entry.request.extra_ids)
        self._count(fetched.transfer)
        return entry, admission, fetched.transfer

    def abandon(self) -> list[Submission]:
        """The requests whose blocks are still on their way, forgotten (the engine stops)."""
        entries = [fetching.entry for fetching in self._fetching.values()]
        self._fetching.clear()
        return entries

    def _check(self, params: ContextPhaseParams, request: EngineRequest) -> None:
        store = self.store
        if params.prompt_length != len(request.input_ids):
            raise BadContextPhase(
                f"context_phase_params are of a prompt of {params.prompt_length} tokens, and "
                f"this request's input_ids hold {len(request.input_ids)}"
            )
        ours = (store.tokens_per_block, store.model_key, store.pool.layout.bytes_per_token)
        theirs = (params.tokens_per_block, params.model_key, params.bytes_per_token)
        if ours != theirs:
            raise BadContextPhase(
                f"the context engine's KV cache (model, block size, bytes per token {theirs}) "
                f"is not this engine's {ours}"
            )
        if not params.first_tokens:
            raise BadContextPhase("context_phase_params carry no first token")


def first_token_logits(
    params: ContextPhaseParams, vocab_size: int, device: torch.device
) -> torch.Tensor:
    """Next-token logits that choose the context phase's first token."""
    logits = torch.full((vocab_size,), _UNCHOSEN, dtype=torch.float32, device=device)
    logits[params.first_tokens[0]] = 0.0
    return logits


def continuing(callback: OutputCallback, transfer: KvTransfer, streaming: bool) -> OutputCallback:
    """A generation-only request's callback: every output reports the handoff, and a stream
    does not repeat the first token, which the context-only response delivered."""

    def deliver(output: SequenceOutput) -> None:
        output = replace(output, kv_transfer=transfer)
        if streaming and output.new_from == 0 and output.token_ids.size:
            output = replace(output, token_ids=output.token_ids[1:], new_from=1)
            if not output.token_ids.size and not output.finished:
                return
        callback(output)

    return deliver


Completed = tuple[Submission, AdmittedBlocks, KvTransfer | tuple[EngineFinishReason, str | None]]
"""A handed-over request's entry, its blocks' admission, and its transfer or why it ends."""
