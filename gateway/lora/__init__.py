"""LoRA adapters served by name on their base models: loading, conversion and routing."""

from gateway.lora.convert import AdapterError
from gateway.lora.library import AdapterExists, LoadedAdapter, LoraLibrary

__all__ = ["AdapterError", "AdapterExists", "LoadedAdapter", "LoraLibrary"]
