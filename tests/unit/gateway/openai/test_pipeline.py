"""The completion pipeline's pure parts: the class a request is queued in."""

from __future__ import annotations

import pytest

from gateway.errors import InvalidRequestError
from gateway.openai.pipeline import request_class


@pytest.mark.parametrize(
    ("tenant_class", "priority", "tier", "expected"),
    [(0, None, None, 0), (2, 1, None, 1), (2, None, "flex", 1), (2, None, "priority", 2),
     (0, -3, "flex", -3), (1, 1, "default", 1)],
)  # fmt: skip
def test_a_request_may_lower_its_class(
    tenant_class: int, priority: int | None, tier: str | None, expected: int
) -> None:
    assert request_class(tenant_class, priority, tier) == expected


def test_a_request_may_not_raise_its_class() -> None:
    with pytest.raises(InvalidRequestError, match="lower its priority") as raised:
        request_class(0, 1, None)
    assert raised.value.param == "priority"
