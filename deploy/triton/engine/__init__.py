"""PyTorch stand-in for TensorRT-LLM: in-flight batching generation over Hugging Face causal LMs.

Importing the package loads nothing heavy: the torch-free parts (``types``, ``wire``,
``outputs``, ``config``) serve the load-test engine too. ``scheduler.Engine`` runs the model;
``triton_model`` is the Python-backend model around it.
"""
