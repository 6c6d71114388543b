"""What the tests share: fixtures' builders, clients of the servers under test, test doubles
that are not part of the product (a recording engine), and the repository's location."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
"""The checkout's root (``shared/`` lies beside it)."""
