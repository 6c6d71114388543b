"""What runs inside tritonserver: the Python-backend models of a rendered repository.

``engine``: the PyTorch engine behind the ``tensorrt_llm`` model (TensorRT-LLM's tensor contract);
``pipeline``: this project's preprocessing, postprocessing and BLS; ``loadtest``: the
zero-compute load-test engine for benchmarks; ``backends``: the ``model.py`` files Triton loads;
``params``: reading model-config parameters; ``vision``: images and the vision tower. The gateway
never imports these, except two torch-free modules both sides share: the incremental detokenizer
(``pipeline.detokenizer``) and a checkpoint's vision settings (``vision.settings``).
"""
