"""LoRA adapters served by name on their base models: loading, conversion and routing."""

from gateway.catalog.lora.convert import AdapterError
from gateway.catalog.lora.library import AdapterExists, LoadedAdapter, LoraLibrary

__all__ = ["AdapterError", "AdapterExists", "LoadedAdapter", "LoraLibrary"]
