"""HTTP route handlers, one module per endpoint family."""
