"""A served model's tokenizer and chat template: prompts templated and counted off the event loop,
and streamed token ids turned back into text."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import Any, TypeVar

from jinja2 import Template, TemplateError

from deploy.triton.pipeline.detokenizer import IncrementalText
from gateway.catalog.text.hub import TextTokenizer, load_tokenizer
from gateway.catalog.text.special import KeptSpecialText
from gateway.catalog.text.template import compile_template, pick_template
from gateway.core.plan import Prompt
from gateway.errors import InvalidRequestError

T = TypeVar("T")
INLINE_CHARS = 4096
"""Inputs up to this many characters are templated and tokenized on the event loop: that takes
tens of microseconds, less than a hop to a worker thread and back. Longer ones go to the
executor so the loop keeps serving other requests."""
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
"""The names templates read a message's reasoning by."""


def _chat_chars(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> int:
    """A cheap upper bound of a conversation's size; tools always count as long."""
    if tools:
        return INLINE_CHARS + 1
    total = 0
    for message in messages:
        content = message.get("content")
        total += len(content) if isinstance(content, str) else INLINE_CHARS // 4
    return total


def strip_leading_bos(text: str, bos_token: str | None) -> str:
    """Drop a BOS the chat template wrote when the backend's tokenizer adds one again."""
    if bos_token and text.startswith(bos_token):
        return text[len(bos_token) :]
    return text


class PromptTokenizer:
    """Templates conversations and counts tokens exactly as Triton's preprocessing will."""

    def __init__(
        self,
        tokenizer: TextTokenizer,
        executor: Executor,
        *,
        chat_template: str | None = None,
        add_special_tokens: bool = True,
        skip_special_tokens: bool = True,
        kept_special_tokens: Sequence[str] = (),
    ) -> None:
        self._tokenizer = tokenizer
        self._executor = executor
        self._chat_template = chat_template
        self._add_special_tokens = add_special_tokens
        self._skip_special_tokens = skip_special_tokens
        self._kept = {
            token: text
            for text in self.special_among(kept_special_tokens)
            if (token := tokenizer.token_id(text)) is not None
        }
        """Special tokens generated text keeps though the others are skipped, by id."""
        special = tokenizer.special_tokens
        self.bos_token = special.get("bos_token")
        self.eos_token = special.get("eos_token")
        self._bos_id = tokenizer.token_id(self.bos_token)
        end_id = tokenizer.token_id(self.eos_token)
        pad_id = tokenizer.token_id(special.get("pad_token"))
        self.end_id = end_id
        """The engine's default end id: the eos token (None when the tokenizer has none)."""
        self.pad_id = end_id if pad_id is None else pad_id
        self._bos_added = self._adds_bos()
        self._compiled: dict[bool, Template] = {}
        """The chat template of requests without tools and with, compiled at first use."""

    @classmethod
    def load(
        cls,
        tokenizer_dir: str,
        executor: Executor,
        *,
        chat_template_file: str | None = None,
        add_special_tokens: bool = True,
        skip_special_tokens: bool = True,
    ) -> PromptTokenizer:
        """Load a Hugging Face tokenizer folder (blocking: call it from a worker thread)."""
        template = Path(chat_template_file).read_text() if chat_template_file else None
        return cls(
            load_tokenizer(tokenizer_dir),
            executor,
            chat_template=template,
            add_special_tokens=add_special_tokens,
            skip_special_tokens=skip_special_tokens,
        )

    @property
    def has_chat_template(self) -> bool:
        """Whether chat requests can be templated for this model."""
        return bool(self._chat_template or self._tokenizer.chat_template)

    @functools.cached_property
    def template_text(self) -> str:
        """The chat template's source (every named template of the tokenizer, joined)."""
        template = self._chat_template or self._tokenizer.chat_template
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
        length = self._tokenizer.model_max_length
        return length if length is not None and 0 < length < 10**7 else None

    @property
    def vocabulary_size(self) -> int:
        """Tokens the tokenizer knows, added ones included."""
        return len(self._tokenizer)

    def token_text(self, token: int) -> str:
        """One token id as the text that tokenizes to it (special tokens spelled out)."""
        return self._tokenizer.decode([token], skip_special_tokens=False)

    async def chat_prompt(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        variables: dict[str, Any] | None = None,
    ) -> Prompt:
        """The templated conversation, ending with the assistant's turn, and its length;
        ``variables`` go to the template beside the messages."""
        return await self._run(
            _chat_chars(messages, tools), self._chat_prompt, messages, tools, variables
        )

    async def text_prompt(self, text: str) -> Prompt:
        """A raw completion prompt and its length; an empty one starts from start-of-text."""
        return await self._run(len(text), self._text_prompt, text)

    async def token_prompt(self, ids: list[int], param: str) -> Prompt:
        """A prompt given as token ids, as text the preprocessing turns back into them."""
        return await self._run(len(ids) * 4, self._token_prompt, ids, param)

    async def text_prompts(self, texts: Sequence[str]) -> list[Prompt]:
        """Several raw completion prompts, tokenized in one call: on the loop when they are
        short together, else off it in one executor job (a batch takes one of the executor's
        threads, never one hop per prompt)."""
        chars = sum(len(text) for text in texts)
        return await self._run(chars, lambda: [self._text_prompt(text) for text in texts])

    async def token_prompts(self, prompts: Sequence[tuple[list[int], str]]) -> list[Prompt]:
        """Several prompts of token ids (each with the field it came from), as ``text_prompts``."""
        chars = sum(len(ids) * 4 for ids, _ in prompts)
        return await self._run(
            chars, lambda: [self._token_prompt(ids, param) for ids, param in prompts]
        )

    async def count(self, text: str) -> int:
        """Tokens in generated text (no special tokens)."""
        return await self._run(len(text), self._count, text)

    def token_count(self, text: str) -> int:
        """Tokens in generated text, counted at once (for short texts, or off the loop)."""
        return self._count(text)

    async def pieces(self, text: str) -> list[str]:
        """Generated text split into the model's tokens."""
        return await self._run(len(text), self._pieces, text)

    def word_ids(self, words: Sequence[str]) -> list[list[int]]:
        """Stop words as the preprocessing encodes them: alone, no special tokens, empty dropped."""
        encoded = (self._tokenizer.encode(word, add_special_tokens=False) for word in words)
        return [ids for ids in encoded if ids]

    def special_among(self, texts: Sequence[str]) -> tuple[str, ...]:
        """Those of ``texts`` that are special tokens of this tokenizer (whole tokens that
        decoding with ``skip_special_tokens`` leaves out)."""
        found = []
        for text in texts:
            token = self._tokenizer.token_id(text)
            if token is not None and not self._tokenizer.decode([token], skip_special_tokens=True):
                found.append(text)
        return tuple(found)

    def keeping(self, special_tokens: Sequence[str]) -> PromptTokenizer:
        """This tokenizer decoding generated text without special tokens but
        ``special_tokens`` (those that are special tokens here)."""
        return PromptTokenizer(
            self._tokenizer,
            self._executor,
            chat_template=self._chat_template,
            add_special_tokens=self._add_special_tokens,
            skip_special_tokens=True,
            kept_special_tokens=special_tokens,
        )

    @property
    def kept_special_tokens(self) -> tuple[str, ...]:
        """The special tokens generated text keeps while it skips the others."""
        return tuple(self._kept.values())

    def text_stream(self) -> IncrementalText:
        """A fresh incremental decoder for one streamed sequence."""
        stream = self._tokenizer.text_stream(skip_special_tokens=self._skip_special_tokens)
        if self._kept and self._skip_special_tokens:
            return KeptSpecialText(stream, self._kept)
        return stream

    async def _run(self, chars: int, function: Callable[..., T], *args: Any) -> T:
        """``function(*args)`` on the loop for an input of ``chars`` characters, or off it."""
        if chars <= INLINE_CHARS:
            return function(*args)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(function, *args))

    def _chat_prompt(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        variables: dict[str, Any] | None = None,
    ) -> Prompt:
        template = self._chat_template or self._tokenizer.chat_template
        if not template:
            raise InvalidRequestError(
                "This model has no chat template; use /v1/completions.", param="model"
            )
        try:
            compiled = self._compiled.get(bool(tools))
            if compiled is None:
                source = pick_template(template, tools=bool(tools))
                compiled = self._compiled[bool(tools)] = compile_template(source)
            text = render_chat(
                compiled,
                messages,
                tools=tools or None,
                special_tokens=self._tokenizer.special_tokens,
                variables=variables,
            )
        except (TemplateError, TypeError, ValueError, KeyError, IndexError) as exc:
            # The template is fixed: what fails while rendering it is the conversation's shape.
            raise InvalidRequestError(
                f"The conversation does not fit the model's chat template: {exc}", param="messages"
            ) from exc
        if self._bos_added:
            text = strip_leading_bos(text, self.bos_token)
        return self._prompt(text)

    def _prompt(self, text: str, shown: str | None = None) -> Prompt:
        ids = self._tokenizer.encode(text, add_special_tokens=self._add_special_tokens)
        return Prompt(
            text=text, token_count=len(ids), shown=shown, ids=tuple(ids), exact_count=len(ids)
        )

    def _text_prompt(self, text: str) -> Prompt:
        prompt = self._prompt(text)
        if prompt.token_count:
            return prompt
        # OpenAI answers an empty prompt as the start of a document.
        start = self.bos_token or self.eos_token
        if not start:
            raise InvalidRequestError(
                "The prompt is empty and this model's tokenizer has no start-of-text token.",
                param="prompt",
            )
        ids = self._tokenizer.encode(start, add_special_tokens=False)
        return Prompt(
            text=start, token_count=len(ids), shown=text, ids=tuple(ids), exact_count=len(ids)
        )

    def _token_prompt(self, ids: list[int], param: str) -> Prompt:
        vocabulary = len(self._tokenizer)
        for index, token in enumerate(ids):
            if not 0 <= token < vocabulary:
                raise InvalidRequestError(
                    f"Token id {token} is outside this model's vocabulary of {vocabulary}.",
                    param=f"{param}[{index}]",
                )
        if self._bos_added and ids and ids[0] == self._bos_id:
            ids = ids[1:]
        text = self._tokenizer.decode(ids, skip_special_tokens=False)
        return self._text_prompt(text)

    def _count(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False))

    def _pieces(self, text: str) -> list[str]:
        ids = self._tokenizer.encode(text, add_special_tokens=False)
        return [self._tokenizer.decode([token], skip_special_tokens=False) for token in ids]

    def _adds_bos(self) -> bool:
        if not self._add_special_tokens or self._bos_id is None:
            return False
        ids = self._tokenizer.encode("a", add_special_tokens=True)
        return bool(ids) and ids[0] == self._bos_id


def render_chat(
    template: Template,
    messages: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None,
    special_tokens: Mapping[str, str],
    add_generation_prompt: bool = True,
    variables: Mapping[str, Any] | None = None,
) -> str:
    """The conversation as a compiled chat template writes it, given what ``transformers``
    gives it: messages without ``None`` fields, reasoning under its aliases, ``tools``,
    ``add_generation_prompt`` and the named special tokens; ``variables`` are the request's
    extra inputs (``reasoning_effort``, ``enable_thinking``)."""
    plain = [_aliased({k: v for k, v in message.items() if v is not None}) for message in messages]
    return template.render(
        messages=plain,
        tools=tools,
        documents=None,
        add_generation_prompt=add_generation_prompt,
        **special_tokens,
        **(variables or {}),
    )


def _aliased(message: dict[str, Any]) -> dict[str, Any]:
    """Reasoning under every name templates read it by."""
    reasoning = next(
        (message[key] for key in REASONING_FIELDS if message.get(key) is not None), None
    )
    if reasoning is None:
        return message
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}
