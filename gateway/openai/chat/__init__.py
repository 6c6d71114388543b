"""``/v1/chat/completions``: ``routes``, ``plan`` (conversation → Plan), ``shape`` (answers)."""
