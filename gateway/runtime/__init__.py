"""What the app starts and stops: the services it serves with (``base``), the sidecars the models
run in, one class per mode (``modes``), the deploy spec read once (``spec``), whether the gateway
takes traffic and the routers' gate that refuses requests while draining (``lifecycle``), and
the sidecars' state a parent shares with its workers (``shared``)."""
