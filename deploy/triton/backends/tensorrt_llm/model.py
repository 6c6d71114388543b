"""Triton entry point of the `tensorrt_llm` model: the PyTorch engine, or the paced load-test
engine where the config says ``load_test_model: true`` (implemented in deploy.triton.engine)."""

from deploy.triton.engine.triton_model import TritonPythonModel  # noqa: F401
