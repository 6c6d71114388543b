"""Triton entry point of the postprocessing model; the implementation is in deploy.pipeline."""

from deploy.pipeline.postprocessing_model import TritonPythonModel

__all__ = ["TritonPythonModel"]
