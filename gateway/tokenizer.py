"""A served model's tokenizer and chat template, run in worker threads off the event loop."""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Executor
from pathlib import Path
from typing import Any, TypeVar

from jinja2 import TemplateError

from gateway.errors import InvalidRequestError
from gateway.translate import Prompt

logger = logging.getLogger(__name__)
T = TypeVar("T")


def strip_leading_bos(text: str, bos_token: str | None) -> str:
    """Drop a BOS the chat template wrote when the backend's tokenizer adds one again."""
    if bos_token and text.startswith(bos_token):
        return text[len(bos_token) :]
    return text


class PromptTokenizer:
    """Templates conversations and counts tokens exactly as Triton's preprocessing will."""

    def __init__(
        self,
        tokenizer: Any,
        executor: Executor,
        *,
        chat_template: str | None = None,
        add_special_tokens: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._executor = executor
        self._chat_template = chat_template
        self._add_special_tokens = add_special_tokens
        # Hugging Face fast tokenizers are not safe to call from several threads at once.
        self._lock = threading.Lock()
        self._bos_added = self._adds_bos()

    @classmethod
    def load(
        cls,
        tokenizer_dir: str,
        executor: Executor,
        *,
        chat_template_file: str | None = None,
        add_special_tokens: bool = True,
    ) -> PromptTokenizer:
        """Load a Hugging Face tokenizer (blocking: call it from a worker thread)."""
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        template = Path(chat_template_file).read_text() if chat_template_file else None
        return cls(
            tokenizer, executor, chat_template=template, add_special_tokens=add_special_tokens
        )

    @property
    def has_chat_template(self) -> bool:
        """Whether chat requests can be templated for this model."""
        return bool(self._chat_template or getattr(self._tokenizer, "chat_template", None))

    @functools.cached_property
    def template_text(self) -> str:
        """The chat template's source (every named template of the tokenizer, joined)."""
        template = self._chat_template or getattr(self._tokenizer, "chat_template", None)
        if isinstance(template, dict):
            return "\n".join(str(text) for text in template.values())
        return str(template or "")

    @functools.cached_property
    def takes_tools(self) -> bool:
        """Whether the chat template renders a ``tools`` list itself."""
        return "tools" in self.template_text

    @property
    def model_max_length(self) -> int | None:
        """The tokenizer's declared context length, when it is a real one."""
        length = getattr(self._tokenizer, "model_max_length", None)
        return int(length) if isinstance(length, int) and 0 < length < 10**7 else None

    async def chat_prompt(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> Prompt:
        """The templated conversation, ending with the assistant's turn, and its length."""
        return await self._run(self._chat_prompt, messages, tools)

    async def text_prompt(self, text: str) -> Prompt:
        """A raw completion prompt and its length; an empty one starts from start-of-text."""
        return await self._run(self._text_prompt, text)

    async def token_prompt(self, ids: list[int], param: str) -> Prompt:
        """A prompt given as token ids, as text the preprocessing turns back into them."""
        return await self._run(self._token_prompt, ids, param)

    async def count(self, text: str) -> int:
        """Tokens in generated text (no special tokens)."""
        return await self._run(self._count, text, False)

    async def pieces(self, text: str) -> list[str]:
        """Generated text split into the model's tokens."""
        return await self._run(self._pieces, text)

    async def _run(self, function: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(function, *args))

    def _chat_prompt(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> Prompt:
        if not self.has_chat_template:
            raise InvalidRequestError(
                "This model has no chat template; use /v1/completions.", param="model"
            )
        try:
            with self._lock:
                text = self._tokenizer.apply_chat_template(
                    messages,
                    tools=tools or None,
                    chat_template=self._chat_template,
                    tokenize=False,
                    add_generation_prompt=True,
                )
        except (TemplateError, TypeError, ValueError, KeyError, IndexError) as exc:
            # The template is fixed: what fails while rendering it is the conversation's shape.
            raise InvalidRequestError(
                f"The conversation does not fit the model's chat template: {exc}", param="messages"
            ) from exc
        if self._bos_added:
            text = strip_leading_bos(text, self._tokenizer.bos_token)
        return Prompt(text=text, token_count=self._count(text, self._add_special_tokens))

    def _text_prompt(self, text: str) -> Prompt:
        count = self._count(text, self._add_special_tokens)
        if count:
            return Prompt(text=text, token_count=count)
        # OpenAI answers an empty prompt as the start of a document.
        start = self._tokenizer.bos_token or self._tokenizer.eos_token
        if not start:
            raise InvalidRequestError(
                "The prompt is empty and this model's tokenizer has no start-of-text token.",
                param="prompt",
            )
        return Prompt(text=start, token_count=self._count(start, False), shown=text)

    def _token_prompt(self, ids: list[int], param: str) -> Prompt:
        vocabulary = len(self._tokenizer)
        for index, token in enumerate(ids):
            if not 0 <= token < vocabulary:
                raise InvalidRequestError(
                    f"Token id {token} is outside this model's vocabulary of {vocabulary}.",
                    param=f"{param}[{index}]",
                )
        if self._bos_added and ids and ids[0] == self._tokenizer.bos_token_id:
            ids = ids[1:]
        with self._lock:
            text = self._tokenizer.decode(ids, skip_special_tokens=False)
        return self._text_prompt(text)

    def _count(self, text: str, special: bool) -> int:
        with self._lock:
            return len(self._tokenizer.encode(text, add_special_tokens=special))

    def _pieces(self, text: str) -> list[str]:
        with self._lock:
            ids = self._tokenizer.encode(text, add_special_tokens=False)
            return [self._tokenizer.decode([token_id]) for token_id in ids]

    def _adds_bos(self) -> bool:
        bos_id = getattr(self._tokenizer, "bos_token_id", None)
        if not self._add_special_tokens or bos_id is None:
            return False
        ids = self._tokenizer.encode("a", add_special_tokens=True)
        return bool(ids) and ids[0] == bos_id
