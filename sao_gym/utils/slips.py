"""Reproducible mistakes for demonstration oracles.

An oracle that slips now and then (a miscopied digit) gives a warm start
something left for RL to improve. Which turns slip must be stable, so the
same task always gets the same demonstration: :func:`unit_hash` maps a text
(say ``f"slip:{seed}:{task_id}:{turn}"``) to a number in [0, 1) that is the
same in every process (unlike ``hash``), and :func:`slip_digit` replaces one
digit of a number.
"""

from __future__ import annotations

import zlib


def unit_hash(text: str) -> float:
    """A stable pseudo-random number in [0, 1) for ``text`` (unlike ``hash``, not salted)."""
    return zlib.crc32(text.encode()) / 2**32


def slip_digit(number: str, u: float) -> str:
    """``number`` with one of its digits (chosen by ``u`` in [0, 1)) replaced by another.

    A text without digits gets a ``0`` appended.

    >>> slip_digit("-6", 0.0), slip_digit("120", 0.5), slip_digit("3.5", 0.99)
    ('-7', '170', '3.4')
    """
    positions = [i for i, c in enumerate(number) if c.isdigit()]
    if not positions:
        return number + "0"
    k = int(u * len(positions) * 9)
    i = positions[k // 9]
    digit = (int(number[i]) + 1 + k % 9) % 10
    return number[:i] + str(digit) + number[i + 1:]


__all__ = ["slip_digit", "unit_hash"]
