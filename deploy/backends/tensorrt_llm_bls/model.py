"""Triton entry point of the tensorrt_llm_bls model; the implementation is in deploy.pipeline."""

from deploy.pipeline.bls_model import TritonPythonModel

__all__ = ["TritonPythonModel"]
