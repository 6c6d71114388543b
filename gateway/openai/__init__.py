"""The OpenAI API: wire types (``protocol``), the sampling fields both completion endpoints share
(``sampling``), answer shaping they share (``shaping``), the one completion ``pipeline``
(authenticate, decode, plan, admit, generate, shape, settle), and one folder per endpoint
family: ``chat``, ``completions`` and ``models``, each with its routes, and for completions its
plan (request → ``core.plan.Plan``) and its shaping (events → OpenAI objects)."""
