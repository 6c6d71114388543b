"""Plans and scripted chunks for the generation core's unit tests."""

from __future__ import annotations

from adapters.contract import SamplingParams, TokenChunk
from gateway.core.plan import ChoiceSpec, Plan, Prompt


def plan(n: int = 1, *, max_tokens: int = 10, stop: tuple[str, ...] = ()) -> Plan:
    """A streamed plan of ``n`` choices of one three-token prompt."""
    prompt = Prompt("hello", 3, exact_count=3)
    params = SamplingParams(max_tokens=max_tokens, stop=stop)
    choices = tuple(ChoiceSpec(i, 0, prompt, params) for i in range(n))
    return Plan(model="tiny", choices=choices, stream=True, include_usage=True)


def chunks(*texts: str, count: int | None = 1) -> list[TokenChunk]:
    """A backend's chunks of ``texts``, ``count`` tokens each."""
    return [TokenChunk(text=t, token_count=count, prompt_tokens=3) for t in texts]
