"""Operating the gateway: liveness and readiness (``health``), the Prometheus routes
(``metrics``), the checks before start (``preflight``) and the starter configuration that
``triton-gateway init`` writes (``starter``)."""
