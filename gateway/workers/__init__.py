"""Several worker processes serving one port (``server.workers``).

The parent (``pool``) supervises what exists once per host: the sidecars, the embedded Redis
that keeps tenant limits exact across workers when no Redis is configured, and the workers
themselves (restarted if one dies). Each worker (``child``) is a whole gateway app with its own
Triton channels, listening on the port through ``SO_REUSEPORT`` so the kernel spreads the
connections; the sidecars' addresses and state reach it through a file the parent keeps
(``gateway.runtime.shared``). Signals go to the parent, which passes them on: every worker
drains as one gateway does. Prometheus metrics are written per process and summed at each scrape.
"""
