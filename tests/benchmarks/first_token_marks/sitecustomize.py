"""Step marks in the gateway's processes for ``tests.benchmarks.first_token``.

Imported at the start of every Python process whose path holds this folder; it does nothing
unless ``FIRST_TOKEN_MARKS`` names a folder, where each process then appends one JSON line per
``/v1`` request: the monotonic nanoseconds at which the request reached each step, keyed by
the client's ``x-probe-id`` header. With ``FIRST_TOKEN_MARKS_EVERY`` set every request is
marked, one without the header as ``any-<pid>-<serial>-<client port>-<chat or text>``
(``tests.benchmarks.marks_report`` reads those), and each worker samples how late its event
loop runs what is ready. The steps are functions of the request path wrapped here by name, so
a renamed one fails loudly. Triton's Python-backend stubs ignore ``PYTHONPATH``: the engine's
side is marked by ``first_token_engine_marks``, installed in their environment.
"""

from __future__ import annotations

import os

if os.environ.get("FIRST_TOKEN_MARKS"):
    import contextvars
    import functools
    import inspect
    import itertools
    import json
    import time
    from typing import Any

    _now = time.monotonic_ns
    _every = bool(os.environ.get("FIRST_TOKEN_MARKS_EVERY"))
    """Mark every request, not only the probes'."""
    _serial = itertools.count()
    _marks: contextvars.ContextVar[dict[str, int] | None] = contextvars.ContextVar(
        "first_token_marks", default=None
    )
    _out = open(  # noqa: SIM115
        f"{os.environ['FIRST_TOKEN_MARKS']}/marks-{os.getpid()}.jsonl", "a", buffering=1
    )

    def _mark(name: str) -> None:
        marks = _marks.get()
        if marks is not None and name not in marks:
            marks[name] = _now()

    def _around(owner: Any, name: str, label: str) -> None:
        original = getattr(owner, name)
        if inspect.iscoroutinefunction(original):

            @functools.wraps(original)
            async def wrapped_async(*args: Any, **kwargs: Any) -> Any:
                _mark(f"{label}.start")
                try:
                    return await original(*args, **kwargs)
                finally:
                    _mark(f"{label}.end")

            setattr(owner, name, wrapped_async)
            return

        @functools.wraps(original)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            _mark(f"{label}.start")
            try:
                return original(*args, **kwargs)
            finally:
                _mark(f"{label}.end")

        setattr(owner, name, wrapped)

    import gateway.app as _app
    from adapters.triton import client as _client
    from adapters.triton import http as _http
    from gateway.catalog.text import prompts as _prompts
    from gateway.core import generation as _generation
    from gateway.observability import Observability
    from gateway.openai import pipeline as _pipeline
    from gateway.tenancy.admission import Admission
    from gateway.tenancy.redis_store import RedisStore
    from gateway.tenancy.service import Tenancy

    _create_app = _app.create_app

    def create_app(*args: Any, **kwargs: Any) -> Any:
        app = _create_app(*args, **kwargs)
        handler = app.asgi_handler

        async def marked(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
                await handler(scope, receive, send)
                return
            probe = dict(scope["headers"]).get(b"x-probe-id", b"").decode()
            if not probe and not _every:
                # Background load (``--background``): not marked.
                await handler(scope, receive, send)
                return
            marks = {"asgi.entry": _now()}
            _sample_loop()
            if not probe:
                client = scope.get("client") or ("", 0)
                kind = "chat" if "chat" in scope["path"] else "text"
                probe = f"any-{os.getpid()}-{next(_serial)}-{client[1]}-{kind}"
            _marks.set(marks)
            sent = 0

            async def send_marked(message: Any) -> None:
                nonlocal sent
                if message["type"] == "http.response.start":
                    marks["response.start"] = _now()
                elif message["type"] == "http.response.body":
                    if sent == 0:
                        sent = 1
                        marks["first_body.send"] = _now()
                    if not message.get("more_body", False):
                        marks["last_body.send"] = _now()
                await send(message)

            try:
                await handler(scope, receive, send_marked)
            finally:
                marks["asgi.exit"] = _now()
                _out.write(json.dumps({"probe": probe, **marks}) + "\n")

        app.asgi_handler = marked
        return app

    _app.create_app = create_app
    _around(Observability, "_open", "observe.open")
    _around(_pipeline.CompletionPipeline, "answer", "pipeline")
    _around(Tenancy, "authenticate", "auth")
    _around(_pipeline, "decode_body", "body.decode")
    _around(_pipeline.CompletionPipeline, "_plan", "plan")
    _around(_prompts.PromptTokenizer, "text_prompt", "tokenize")
    _around(_prompts.PromptTokenizer, "chat_prompt", "tokenize")
    _around(Tenancy, "admission", "admission.send")
    _around(RedisStore, "admit", "admission.write")
    _around(Admission, "admitted", "admission.wait")
    _around(Admission, "settle", "settle")
    _around(_generation.GenerationService, "events", "events")
    _around(_client, "build_inputs", "triton.inputs")
    _around(_http.HttpCall, "_send", "triton.send")
    _around(_http.HttpCall, "_dial_and_write", "triton.dial")
    _around(_http.ChunkedEvents, "feed", "triton.first_bytes")
    _around(_http, "reply_of", "triton.first_reply")

    # When the call's request was written (``triton.written``: by ``start`` on a spare
    # connection, or once dialled), and when Triton's first bytes for it reach the worker: the
    # event loop's read callback (``triton.arrived``), run when the loop next polls its sockets,
    # before the call's task is woken to read them (``triton.send.end`` and
    # ``triton.first_bytes`` follow). Callbacks run outside the request's context, so the call's
    # connection is tied to the request's marks when the request goes on it.
    import asyncio
    import weakref

    _awaited: weakref.WeakKeyDictionary[asyncio.StreamReader, dict[str, int]]
    _awaited = weakref.WeakKeyDictionary()

    def _await_bytes(connection: Any) -> None:
        marks = _marks.get()
        if marks is not None and connection is not None:
            marks.setdefault("triton.written", _now())
            _awaited[connection[0]] = marks

    _start = _http.HttpCall.start

    def start(self: Any) -> None:
        _start(self)
        _await_bytes(self._connection)

    _dial_and_write = _http.HttpCall._dial_and_write

    async def dial_and_write(self: Any) -> None:
        await _dial_and_write(self)
        _await_bytes(self._connection)

    _connect = _http.HttpStreams.connect

    async def connect(self: Any, url: str) -> Any:
        connection, spare = await _connect(self, url)
        _await_bytes(connection)
        return connection, spare

    _feed_data = asyncio.StreamReader.feed_data

    def feed_data(self: asyncio.StreamReader, data: bytes) -> None:
        marks = _awaited.pop(self, None)
        if marks is not None:
            marks.setdefault("triton.arrived", _now())
        _feed_data(self, data)

    # Triton's id of the request's call, by which marks_report finds the engine's marks of it
    # (``first_token_engine_marks``).
    _generate_body = _client.generate_body

    def generate_body(request_id: str, *args: Any, **kwargs: Any) -> bytes:
        marks = _marks.get()
        if marks is not None:
            marks["triton_id"] = request_id  # type: ignore[assignment]
        return _generate_body(request_id, *args, **kwargs)

    _client.generate_body = generate_body

    # How late the worker's event loop runs what is ready: every 2 ms, the time from a
    # callback's scheduling (``call_soon``) to its run, the loop's work of an iteration on the
    # sockets that were ready ahead of it. A line of samples per worker every 500 of them.
    _lags: list[int] = []

    def _tick(loop: asyncio.AbstractEventLoop) -> None:
        loop.call_soon(_tock, loop, _now())

    def _tock(loop: asyncio.AbstractEventLoop, scheduled: int) -> None:
        _lags.append(_now() - scheduled)
        if len(_lags) >= 500:
            _out.write(json.dumps({"loop": os.getpid(), "lags": _lags}) + "\n")
            _lags.clear()
        loop.call_later(0.002, _tick, loop)

    _sampling: list[asyncio.AbstractEventLoop] = []

    def _sample_loop() -> None:
        if _every and not _sampling:
            _sampling.append(asyncio.get_running_loop())
            _tick(_sampling[0])

    _http.HttpCall.start = start  # type: ignore[method-assign]
    _http.HttpCall._dial_and_write = dial_and_write  # type: ignore[method-assign]
    _http.HttpStreams.connect = connect  # type: ignore[method-assign]
    asyncio.StreamReader.feed_data = feed_data  # type: ignore[method-assign]
