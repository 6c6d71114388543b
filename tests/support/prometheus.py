"""Samples of Prometheus' text exposition format, as Triton and the gateway write it (no
timestamps), and the value of one sample or the sum of several by family and labels."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

Sample = tuple[str, dict[str, str], float]
"""One line of Prometheus' text format: the metric's name, its labels, its value."""

_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
_ESCAPE = re.compile(r"\\(.)")


def _unescaped(text: str) -> str:
    return _ESCAPE.sub(lambda m: "\n" if m[1] == "n" else m[1], text)


def parse(text: str) -> list[Sample]:
    """The samples of Prometheus' text format, label values unescaped."""
    samples = []
    for line in text.splitlines():
        if line and not line.startswith("#"):
            head, _, number = line.rpartition(" ")
            name, _, labels = head.partition("{")
            found = {key: _unescaped(raw) for key, raw in _LABEL.findall(labels)}
            samples.append((name, found, float(number)))
    return samples


def _matching(text: str, family: str, labels: dict[str, str]) -> list[float]:
    return [
        number
        for name, have, number in parse(text)
        if name == family and all(have.get(k) == v for k, v in labels.items())
    ]


def value(text: str, family: str, **labels: str) -> float:
    """The value of the one sample named ``family`` whose labels include ``labels``."""
    found = _matching(text, family, labels)
    if len(found) != 1:
        raise AssertionError(f"{len(found)} samples of {family} {labels} in the metrics, not 1")
    return found[0]


def total(text: str, family: str, **labels: str) -> float:
    """The sum of the samples named ``family`` whose labels include ``labels``; 0.0 if none."""
    return sum(_matching(text, family, labels), 0.0)


def scrape_until(
    scrape: Callable[[], str], family: str, expected: float, timeout_s: float = 10.0, **labels: str
) -> str:
    """Scrapes until the samples of ``family`` with ``labels`` sum to ``expected``; the text that
    showed it. A request is counted as it closes, just after its last bytes went out, so a
    scrape right after its answer may come first."""
    deadline = time.monotonic() + timeout_s
    while total(text := scrape(), family, **labels) != expected:
        assert time.monotonic() < deadline, f"{family} {labels} never reached {expected}"
        time.sleep(0.05)
    return text


def read_until(read: Callable[[], float], check: Callable[[float], bool]) -> float:
    """The first reading that passes ``check``, read again every 50 ms for 20 s at most: an
    engine publishes its metrics every 100 ms."""
    deadline = time.monotonic() + 20
    reading = read()
    while not check(reading):
        assert time.monotonic() < deadline, f"the metrics never showed it: {reading}"
        time.sleep(0.05)
        reading = read()
    return reading
