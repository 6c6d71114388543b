"""Triton model repositories, Python-backend models and tritonserver sidecars."""
