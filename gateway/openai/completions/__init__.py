"""``/v1/completions``: ``routes``, ``plan`` (prompts → Plan), ``shape`` (answers)."""
