"""Developer tools run from the command line, never imported by the product: the engine
benchmark (``python -m deploy.devtools.bench``) and offline bundles for GPU hosts without
network (``python -m deploy.devtools.offline``)."""
