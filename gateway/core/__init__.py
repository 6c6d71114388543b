"""The generation core, free of HTTP and of OpenAI's shapes: the one ``Plan`` of a request
(``plan``), running its choices against the backend as neutral events (``generation``), merging
and timing streams (``streams``) and cutting stop sequences (``stops``)."""

from gateway.core.plan import ChoiceSpec, Plan, Prompt

__all__ = ["ChoiceSpec", "Plan", "Prompt"]
