"""The small interfaces the generation core takes from the rooms above it: the served model and
its tokenizer, the tenant's admission under way, and where a pooled model's requests go."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from adapters.contract import (
    Backend,
    GenerationRequest,
    LoraAdapter,
    ModelTarget,
    PreparedRequest,
    TokenText,
)
from gateway.core.plan import Prompt
from gateway.observability import GenerationWatch


class ModelTokenizer(TokenText, Protocol):
    """The served model's tokenizer, as the core counts with it."""

    async def count(self, text: str) -> int:
        """Tokens of ``text`` (no special tokens added)."""
        ...

    async def pieces(self, text: str) -> list[str]:
        """``text`` as the texts of its tokens."""
        ...


class GeneratedModel(Protocol):
    """A served model as the core runs it (the catalog's ``ServedModel``)."""

    @property
    def name(self) -> str: ...

    @property
    def base(self) -> str | None: ...

    @property
    def target(self) -> ModelTarget: ...

    @property
    def adapter(self) -> LoraAdapter | None: ...

    @property
    def tokenizer(self) -> ModelTokenizer: ...

    def own_count(self, prompt: Prompt) -> int | None:
        """The prompt's length where the engine need not count it again (else None)."""
        ...


class PendingAdmission(Protocol):
    """The tenant's admission of a request, answered while the request is prepared."""

    @property
    def expected(self) -> bool:
        """The answer is all but sure to admit: the request may go before it comes."""
        ...

    async def admitted(self) -> None:
        """Wait for the answer; a refusal raises the client's error."""
        ...


Prepare = Callable[[GenerationRequest], Awaitable[PreparedRequest]]
"""Prepares one backend request for wherever it is to go."""


class Dispatcher(Protocol):
    """Where a model's requests go when they do not go straight to its one Triton: its replica
    pool, the slots of a model with a bounded number in flight."""

    def preparer(
        self, model: str, backend: Backend, target: ModelTarget, watch: GenerationWatch
    ) -> Prepare | None:
        """How the base model ``model``'s requests are prepared (its pool, its slots); None
        where they go straight to ``target``, its one Triton."""
        ...
