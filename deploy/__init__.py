"""Triton model repositories and the tritonserver sidecars that serve them, split by where the
code runs: ``sidecar`` (rendering and supervising, what the gateway calls), ``triton`` (the
Python-backend models inside tritonserver) and ``devtools`` (benchmarks and offline bundles).
``deploy`` imports neither ``gateway`` nor ``adapters``."""
