"""OpenAI-compatible HTTP gateway over Triton Inference Server running TensorRT-LLM models."""
