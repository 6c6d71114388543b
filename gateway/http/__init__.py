"""The HTTP edge shared by every route: the error tree rendered as OpenAI's error object
(``errors``), request bodies decoded and answers written as bare ASGI apps, whole JSON or
server-sent events (``answers``, ``sse``), and the API description (``openapi``, ``docs``)."""
