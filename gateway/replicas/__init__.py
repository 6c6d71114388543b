"""Models served by several Triton replicas: where each request goes, and replica health.

``settings`` (the ``replicas`` and ``routing`` of a model), ``sources`` (endpoint lists, DNS
names, sidecars), the pure parts (``policy`` scores replicas, ``affinity`` remembers where
prefixes and adapters went, ``health`` ejects and takes back, ``signals`` reads Triton's
metrics), ``pool`` (one model's replicas and the choice among them), ``dispatch`` (a request's
stream, retried once on another replica before its first token), ``watch`` (probes, scrapes and
DNS, the I/O at the edges), ``router`` (every pool of the app) and ``metrics``.
"""
