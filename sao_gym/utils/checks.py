"""Small checks that config records share."""

from __future__ import annotations

from typing import Any


def at_least(obj: Any, low: int, *names: str, prefix: str = "",
             error: type[Exception] = ValueError) -> None:
    """Raise ``error`` naming ``prefix + name`` for the first of ``names`` below ``low``.

    None passes (a value fitted later, or unset, is checked where it is set).

    >>> at_least(type("R", (), {"n": 0})(), 1, "n", prefix="rollout.")
    Traceback (most recent call last):
    ...
    ValueError: rollout.n must be >= 1, got 0
    """
    for name in names:
        value = getattr(obj, name)
        if value is not None and value < low:
            raise error(f"{prefix}{name} must be >= {low}, got {value}")
