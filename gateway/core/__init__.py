"""The generation core, free of HTTP, OpenAI's shapes, tenancy, the catalog and the replica pools
(it takes them as the small interfaces of ``ports``): the one ``Plan`` of a request (``plan``),
its backend requests prepared, admitted and streamed as neutral events (``generation``), each
choice's events (``choices``, ``events``), merging and timing streams (``streams``) and cutting
stop sequences (``stops``)."""

from gateway.core.plan import ChoiceSpec, Plan, Prompt

__all__ = ["ChoiceSpec", "Plan", "Prompt"]
