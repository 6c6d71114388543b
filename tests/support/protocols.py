"""Whether a class implements a Protocol's methods with their signatures, not only their names.

``isinstance`` against a ``runtime_checkable`` Protocol checks that the names exist and nothing
else: a ``generate`` that takes other arguments, or an ``is_ready`` that is no coroutine, passes.
This compares each method's parameters (names, kinds, defaults, resolved annotations), whether it
is awaited or iterated, and its return type (a generic subtype with the same arguments, as an
``AsyncGenerator[T, None]`` is an ``AsyncIterator[T]``).
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import AsyncIterator, Callable
from typing import Any


def protocol_methods(protocol: type) -> list[str]:
    """The public methods a Protocol declares (not those of its bases such as ``object``)."""
    return sorted(
        name
        for name, value in vars(protocol).items()
        if not name.startswith("_") and inspect.isfunction(value)
    )


def _return_conforms(declared: Any, given: Any) -> bool:
    if declared == given:
        return True
    declared_origin = typing.get_origin(declared) or declared
    given_origin = typing.get_origin(given) or given
    if not (isinstance(declared_origin, type) and isinstance(given_origin, type)):
        return False
    if getattr(declared_origin, "_is_protocol", False):
        # A protocol returned (the prepared request): the class returned must keep it, whole.
        return not mismatches(given_origin, declared_origin)
    if not issubclass(given_origin, declared_origin):
        return False
    declared_args = typing.get_args(declared)
    return typing.get_args(given)[: len(declared_args)] == declared_args


def _parameters(function: Callable[..., Any]) -> list[tuple[str, Any, bool, Any]]:
    hints = typing.get_type_hints(function)
    return [
        (p.name, p.kind, p.default is inspect.Parameter.empty, hints.get(p.name))
        for p in inspect.signature(function).parameters.values()
    ]


def _how_called(function: Callable[..., Any], returns: Any) -> str:
    if inspect.iscoroutinefunction(function):
        return "awaited"
    if inspect.isasyncgenfunction(function):
        return "iterated"
    origin = typing.get_origin(returns) or returns
    if isinstance(origin, type) and issubclass(origin, AsyncIterator):
        return "iterated"
    return "called"


def mismatches(implementation: type, protocol: type) -> list[str]:
    """What in ``implementation`` differs from ``protocol``'s methods, one line each."""
    found: list[str] = []
    for name in protocol_methods(protocol):
        declared = getattr(protocol, name)
        given = getattr(implementation, name, None)
        if not callable(given):
            found.append(f"{name}: missing")
            continue
        if _parameters(given) != _parameters(declared):
            found.append(
                f"{name}: parameters {inspect.signature(given)} "
                f"where the protocol has {inspect.signature(declared)}"
            )
        declared_return = typing.get_type_hints(declared).get("return")
        given_return = typing.get_type_hints(given).get("return")
        if not _return_conforms(declared_return, given_return):
            found.append(f"{name}: returns {given_return} where the protocol has {declared_return}")
        declared_call = _how_called(declared, declared_return)
        given_call = _how_called(given, given_return)
        if given_call != declared_call:
            found.append(f"{name}: {given_call} where the protocol's is {declared_call}")
    return found
