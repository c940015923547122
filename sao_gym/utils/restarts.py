"""How often each of a set of parts was started again, against one limit.

Every part the run replaces when it dies (a launched inference server, a
server actor, a Ray rollout worker) counts its replacements the same way:
:meth:`Restarts.spend` takes one for part ``i`` or says, in one line, that
it was replaced ``limit`` times already.
"""

from __future__ import annotations


class GivenUp(RuntimeError):
    """A part was replaced as often as its limit allows."""


class Restarts:
    """Replacements of ``parts`` parts, at most ``limit`` each.

    >>> r = Restarts(2, limit=1)
    >>> r.spend(0, "server 0"), r.used
    (1, [1, 0])
    >>> try:
    ...     r.spend(0, "server 0")
    ... except GivenUp as e:
    ...     print(e)
    server 0 was replaced 1 times already (max_restarts=1); not again
    """

    def __init__(self, parts: int, *, limit: int):
        if limit < 0:
            raise ValueError(f"the restart limit must be >= 0, got {limit}")
        self.limit = limit
        self.used = [0] * parts
        """Replacements so far, per part."""

    @property
    def total(self) -> int:
        """Replacements of all parts."""
        return sum(self.used)

    def spend(self, i: int, what: str) -> int:
        """Count one replacement of part ``i`` (named ``what``); its number (1-based).

        Raises :class:`GivenUp` when part ``i`` was replaced ``limit`` times already.
        """
        if self.used[i] >= self.limit:
            raise GivenUp(f"{what} was replaced {self.used[i]} times already "
                          f"(max_restarts={self.limit}); not again")
        self.used[i] += 1
        return self.used[i]


__all__ = ["GivenUp", "Restarts"]
