"""A served model's text: its tokenizer read with ``tokenizers`` (``hub``), chat templates
rendered as transformers renders them (``template``), and prompts counted, templated and
decoded back incrementally (``prompts``)."""
