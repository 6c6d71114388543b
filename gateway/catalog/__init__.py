"""What the gateway serves: the models and where they run in Triton (``registry``), their
tokenizers and chat templates (``text``), and LoRA adapters (``lora``)."""
