"""OpenAI-compatible HTTP gateway over Triton Inference Server running TensorRT-LLM models.

How a request travels (folders in order): ``http`` (body decoding, errors, SSE and JSON answers)
→ ``openai`` (the endpoint's route, its plan and shaping, and the one completion ``pipeline``)
→ ``tenancy`` (keys and limits) → ``core`` (generation over the backend: streams, stop
sequences) → ``adapters`` (the backend contract and Triton). ``catalog`` holds what is served
(models, tokenizers and templates, LoRA adapters); ``tools`` tool calls and structured output;
``observability`` metrics, traces and logs; ``ops`` health, metrics routes, draining and the
starter configuration. At the top: ``app`` (composition root), ``runtime`` (what starts and
stops), ``server`` (uvicorn and signals), ``settings`` and ``cli``.
"""
