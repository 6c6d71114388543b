"""Chat templates compiled as ``transformers`` compiles them, without importing it.

The same sandboxed jinja2 environment (``trim_blocks``, ``lstrip_blocks``, loop controls), the
same ``tojson`` filter (no HTML escaping), the same globals (``raise_exception``,
``strftime_now``, a restricted ``namespace``); of a model's named templates, the one a request
takes. A model compiles each of its templates once; ``gateway.catalog.text.prompts`` renders
them with the inputs ``transformers`` gives.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _Namespace(jinja2.utils.Namespace):
    """``namespace()`` that refuses underscore-prefixed attributes."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"Chat templates cannot store underscore-prefixed attributes ({name!r})."
            )


class _Dict:
    """``dict(...)`` for templates, without access to the type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


@functools.lru_cache(maxsize=32)
def compile_template(source: str) -> jinja2.Template:
    """A chat template compiled once per source text."""
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    environment.globals["dict"] = _Dict()
    environment.globals["namespace"] = _Namespace
    return environment.from_string(source)


def pick_template(template: str | Mapping[str, str], *, tools: bool) -> str:
    """One source from a model's templates: ``tool_use`` for tools, else ``default``."""
    if isinstance(template, str):
        return template
    if tools and "tool_use" in template:
        return template["tool_use"]
    if "default" in template:
        return template["default"]
    raise jinja2.exceptions.TemplateError(
        f"the model has several chat templates and none is the default: {sorted(template)}"
    )
