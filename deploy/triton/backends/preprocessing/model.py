"""Triton entry point of the preprocessing model (implemented in deploy.triton.pipeline)."""

from deploy.triton.pipeline.preprocessing_model import TritonPythonModel

__all__ = ["TritonPythonModel"]
