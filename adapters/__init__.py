"""Backend contract and its Triton/TensorRT-LLM implementation."""
