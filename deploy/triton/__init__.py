"""What runs inside tritonserver: the Python-backend models of a rendered repository.

``engine``: the PyTorch engine behind the ``tensorrt_llm`` model (TensorRT-LLM's tensor contract);
``pipeline``: this project's preprocessing, postprocessing and BLS; ``loadtest``: the
zero-compute load-test engine for benchmarks; ``backends``: the ``model.py`` files Triton loads;
``params``: reading model-config parameters. The gateway never imports these, except the
incremental detokenizer (``pipeline.detokenizer``), the one text utility both sides share.
"""
