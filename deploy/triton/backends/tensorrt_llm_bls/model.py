"""Triton entry point of the tensorrt_llm_bls model (implemented in deploy.triton.pipeline)."""

from deploy.triton.pipeline.bls_model import TritonPythonModel

__all__ = ["TritonPythonModel"]
