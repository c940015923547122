"""Filter, sort and page a split's episode index (the viewer's episode list), from URL parameters.

:func:`query` takes the index entries of :class:`~sao_gym.rollout_store.RolloutReader`
and a mapping of query-string parameters (all strings, all optional):

- ``step_min``, ``step_max``, ``reward_min``, ``reward_max``: numeric bounds (inclusive);
- ``stop_reason``, ``env``: one value or several, comma-separated (exact match);
- ``task``: a substring of the task id;
- ``truncated``, ``infra``, ``traced``: ``yes`` or ``no`` (``any``/empty: no filter);
- ``sort``: one of :data:`SORT_KEYS` (default ``id``), ``order``: ``asc``/``desc``;
- ``page`` (from 0) and ``size`` (1 to :data:`MAX_PAGE`, default 50).

A malformed parameter raises :class:`ValueError` naming it (the server answers 400).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

SORT_KEYS = ("id", "step", "reward", "turns", "tokens", "action_tokens", "stop_reason",
             "task_id", "env_id", "seed")
"""Index fields the list sorts by."""

MAX_PAGE = 500
"""Most episodes one page holds."""

LISTED = ("id", "step", "reward", "stop_reason", "env_id", "task_id", "seed", "turns",
          "tokens", "action_tokens", "truncated", "infra_failure", "traced")
"""Fields of an entry the list shows."""

_FLAGS = {"truncated": "truncated", "infra": "infra_failure", "traced": "traced"}


def _number(params: Mapping[str, str], name: str) -> float | None:
    raw = params.get(name, "")
    if raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {raw!r}") from None
    if math.isnan(value):
        raise ValueError(f"{name} must be a number, got {raw!r}")
    return value


def _integer(params: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = params.get(name, "")
    if raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}")
    return value


def _flag(params: Mapping[str, str], name: str) -> bool | None:
    raw = params.get(name, "").lower()
    if raw in ("", "any"):
        return None
    if raw not in ("yes", "no"):
        raise ValueError(f"{name} must be yes, no or any, got {raw!r}")
    return raw == "yes"


def _between(key: str, low: float | None, high: float | None
             ) -> Callable[[dict[str, Any]], bool] | None:
    if low is None and high is None:
        return None
    lo = -math.inf if low is None else low
    hi = math.inf if high is None else high

    def test(e: dict[str, Any]) -> bool:
        v = e.get(key)
        return v is not None and lo <= v <= hi
    return test


def filters(params: Mapping[str, str]) -> list[Callable[[dict[str, Any]], bool]]:
    """The entry predicates ``params`` asks for (module docs)."""
    tests = [t for t in (
        _between("step", _number(params, "step_min"), _number(params, "step_max")),
        _between("reward", _number(params, "reward_min"), _number(params, "reward_max")),
    ) if t is not None]
    for name, key in (("stop_reason", "stop_reason"), ("env", "env_id")):
        wanted = {v for v in params.get(name, "").split(",") if v}
        if wanted:
            tests.append(lambda e, k=key, w=frozenset(wanted): e.get(k) in w)
    task = params.get("task", "")
    if task:
        tests.append(lambda e: task in str(e.get("task_id", "")))
    for name, key in _FLAGS.items():
        flag = _flag(params, name)
        if flag is not None:
            tests.append(lambda e, k=key, f=flag: bool(e.get(k)) == f)
    return tests


def _sorted(entries: list[dict[str, Any]], key: str, descending: bool) -> list[dict[str, Any]]:
    """``entries`` by ``key`` (stable), entries without a value last either way."""
    present = [e for e in entries if e.get(key) is not None]
    # numbers before strings: the two are never compared with each other
    present.sort(key=lambda e: (isinstance(e[key], str), e[key]), reverse=descending)
    return present + [e for e in entries if e.get(key) is None]


def plan(params: Mapping[str, str]) -> tuple[list[Callable[[dict[str, Any]], bool]], str, str,
                                             int, int]:
    """``(filters, sort, order, size, page)`` of ``params``, checked (module docs)."""
    tests = filters(params)
    sort = params.get("sort", "") or "id"
    if sort not in SORT_KEYS:
        raise ValueError(f"sort must be one of {', '.join(SORT_KEYS)}, got {sort!r}")
    order = params.get("order", "") or "asc"
    if order not in ("asc", "desc"):
        raise ValueError(f"order must be asc or desc, got {order!r}")
    return (tests, sort, order, _integer(params, "size", 50, 1, MAX_PAGE),
            _integer(params, "page", 0, 0, 10**9))


def listed(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of ``entry`` the list shows (:data:`LISTED`)."""
    return {k: entry.get(k) for k in LISTED}


def query(entries: Sequence[dict[str, Any]], params: Mapping[str, str],
          facets_of: Callable[[Sequence[dict[str, Any]]], dict[str, list[str]]] | None = None
          ) -> dict[str, Any]:
    """One page of ``entries`` as ``params`` asks (module docs).

    Returns ``{"total", "page", "size", "pages", "episodes", "facets"}``; ``facets``
    holds the stop reasons and environments present in the whole split (for the
    list's choices), from ``facets_of`` (default :func:`facets`; a caller that
    keeps them passes its own).
    """
    tests, sort, order, size, page = plan(params)
    chosen = [e for e in entries if all(t(e) for t in tests)] if tests else list(entries)
    if sort != "id":  # entries come in id order
        chosen = _sorted(chosen, sort, order == "desc")
    elif order == "desc":
        chosen.reverse()
    total = len(chosen)
    rows = chosen[page * size:(page + 1) * size]
    return {"total": total, "page": page, "size": size, "pages": max(1, -(-total // size)),
            "episodes": [listed(e) for e in rows],
            "facets": (facets_of or facets)(entries)}


def facets(entries: Sequence[dict[str, Any]]) -> dict[str, list[str]]:
    """Stop reasons and environments present in ``entries``, sorted."""
    return {"stop_reason": sorted({str(e.get("stop_reason")) for e in entries}),
            "env": sorted({str(e.get("env_id")) for e in entries})}
