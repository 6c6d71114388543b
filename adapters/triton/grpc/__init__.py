"""Triton's gRPC ``ModelStreamInfer`` (``stream``): the transport for what Triton's HTTP frontend
cannot keep or JSON cannot carry (docs/deployment/transports.md)."""
