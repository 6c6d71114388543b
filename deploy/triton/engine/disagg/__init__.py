"""Disaggregated serving in the torch engine: TensorRT-LLM's ``request_type`` and
``context_phase_params``, and the KV-cache handoff between a context and a generation engine."""
