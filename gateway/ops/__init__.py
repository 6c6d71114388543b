"""Operating the gateway: liveness and readiness (``health``), the Prometheus routes
(``metrics``), the drain on shutdown (``drain``) and the starter configuration that
``triton-gateway init`` writes (``starter``)."""
