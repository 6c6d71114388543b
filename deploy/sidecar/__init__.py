"""The sidecar side of deploy: what the gateway and the deploy command run to serve models.

Deploy specs (``spec``), built-in model names and the test models behind them (``models``),
rendering Triton model repositories from each TensorRT-LLM release's templates (``render``),
finding a ``tritonserver`` (``tritonbin``), supervising it (``supervisor``), and the
``triton-gateway deploy`` command line (``cli``). Nothing here runs inside tritonserver.
"""
