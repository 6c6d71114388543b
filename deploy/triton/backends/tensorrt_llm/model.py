"""Triton entry point of the `tensorrt_llm` model backed by the PyTorch engine."""

from deploy.triton.engine.triton_model import TritonPythonModel  # noqa: F401
