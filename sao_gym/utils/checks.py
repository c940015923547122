"""Small checks that config records share."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def at_least(values: Mapping[str, Any], low: int, *, prefix: str = "",
             error: type[Exception] = ValueError) -> None:
    """Raise ``error`` naming ``prefix + name`` for the first of ``values`` below ``low``.

    ``values``: field name -> value. None passes (a value fitted later, or
    unset, is checked where it is set).

    >>> at_least({"batch_size": 4, "concurrency": 0}, 1, prefix="rollout.")
    Traceback (most recent call last):
    ...
    ValueError: rollout.concurrency must be >= 1, got 0
    """
    for name, value in values.items():
        if value is not None and value < low:
            raise error(f"{prefix}{name} must be >= {low}, got {value}")
