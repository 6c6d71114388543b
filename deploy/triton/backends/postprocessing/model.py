"""Triton entry point of the postprocessing model (implemented in deploy.triton.pipeline)."""

from deploy.triton.pipeline.postprocessing_model import TritonPythonModel

__all__ = ["TritonPythonModel"]
