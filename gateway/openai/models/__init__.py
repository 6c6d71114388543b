"""``/v1/models``: the models and adapters a caller may use."""
