"""Triton entry point of the preprocessing model; the implementation is in deploy.pipeline."""

from deploy.pipeline.preprocessing_model import TritonPythonModel

__all__ = ["TritonPythonModel"]
