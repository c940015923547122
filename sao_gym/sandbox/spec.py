"""Sandbox specs: the config value that names a backend, its options and a shared pool's.

A spec is a backend name (``"local"``) or a mapping ``{"backend": name,
**options, "pool": {...}}``; :func:`split_pool_options` separates the pool's
options (:data:`POOL_OPTIONS`) from the sandbox's. Torch- and backend-free.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

POOL_OPTIONS: dict[str, Any] = {
    "size": 0,
    "max_concurrency": 256,
    "setup_timeout_s": 60.0,
    "teardown_timeout_s": 30.0,
}
"""Options of a shared pool (the ``"pool"`` entry of a sandbox spec), with their defaults.

No warm sandboxes by default; ``max_concurrency`` is a safety bound, not a throttle."""


def split_pool_options(
    spec: str | Mapping[str, Any],
) -> tuple[str | Mapping[str, Any], dict[str, Any]]:
    """``spec`` without its ``"pool"`` entry, and the shared pool's options (defaults filled).

    Example:
        >>> spec, options = split_pool_options({"backend": "local", "pool": {"size": 2}})
        >>> spec, options["size"], options["max_concurrency"]
        ({'backend': 'local'}, 2, 256)

    Raises:
        ValueError: unknown or out-of-range pool options.

    """
    if not isinstance(spec, Mapping) or "pool" not in spec:
        return spec, dict(POOL_OPTIONS)
    rest = dict(spec)
    given = rest.pop("pool")
    if not isinstance(given, Mapping):
        raise ValueError(f'the sandbox spec\'s "pool" must be a mapping of options '
                         f"{sorted(POOL_OPTIONS)}, got {given!r}")
    unknown = set(given) - set(POOL_OPTIONS)
    if unknown:
        raise ValueError(f"unknown sandbox pool options {sorted(unknown)}; valid: "
                         f"{sorted(POOL_OPTIONS)}")
    options = {**POOL_OPTIONS, **given}
    for name, low in (("size", 0), ("max_concurrency", 1)):
        value = options[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"sandbox pool {name} must be an int >= {low}, got {value!r}")
    for name in ("setup_timeout_s", "teardown_timeout_s"):
        value = options[name]
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not (value > 0 and math.isfinite(value))):
            raise ValueError(f"sandbox pool {name} must be a number > 0 or None, got {value!r}")
    return rest, options
