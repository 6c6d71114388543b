"""Triton entry point of the multimodal_encoders model (implemented in deploy.triton.vision)."""

from deploy.triton.vision.encoder_model import TritonPythonModel

__all__ = ["TritonPythonModel"]
