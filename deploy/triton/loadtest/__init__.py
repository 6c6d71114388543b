"""The ZERO-COMPUTE load-test engine, a stand-in for ``tensorrt_llm`` in benchmarks only."""
