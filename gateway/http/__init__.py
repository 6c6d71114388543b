"""The HTTP plumbing every route shares: request bodies decoded and answers written as bare ASGI
apps, whole JSON or server-sent events (``answers``, ``sse``), and the front door uvicorn serves
through (``door``, ``protocol``)."""
