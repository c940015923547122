"""Sandboxes for model-written code.

- :class:`~sao_gym.sandbox.base.Sandbox`: the protocol; :class:`ExecResult`,
  :class:`Limits` and the errors live in :mod:`sao_gym.sandbox.base`.
- ``LocalSandbox`` (bubblewrap, the default) and ``DockerSandbox`` (the
  ``docker`` extra), imported lazily.
- :class:`~sao_gym.sandbox.pool.SandboxPool`: warm, bounded, single-use;
  :func:`shared_pool` (one per spec and event loop) and
  :class:`EpisodeSandbox` (an env's lease, from reset to close).
- :func:`make_sandbox`: a sandbox from a config value.

What each backend isolates, and what not: docs/sandbox.md.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from sao_gym.sandbox.base import (
    ExecResult,
    Limits,
    Sandbox,
    SandboxCrashed,
    SandboxError,
    SandboxTimeout,
    SandboxUnavailable,
)
from sao_gym.sandbox.pool import (
    POOL_OPTIONS,
    EpisodeSandbox,
    SandboxLease,
    SandboxPool,
    aclose_shared_pools,
    shared_pool,
    split_pool_options,
)

BACKENDS = {
    "local": "sao_gym.sandbox.local:LocalSandbox",
    "docker": "sao_gym.sandbox.docker:DockerSandbox",
}

__all__ = [
    "BACKENDS",
    "POOL_OPTIONS",
    "EpisodeSandbox",
    "ExecResult",
    "Limits",
    "Sandbox",
    "SandboxCrashed",
    "SandboxError",
    "SandboxLease",
    "SandboxPool",
    "SandboxTimeout",
    "SandboxUnavailable",
    "aclose_shared_pools",
    "backend_class",
    "make_sandbox",
    "shared_pool",
    "split_pool_options",
    "start_sandbox",
]


def backend_class(name: str) -> type:
    """The sandbox class registered as ``name`` (``local`` or ``docker``)."""
    if name not in BACKENDS:
        raise ValueError(f"unknown sandbox backend {name!r}; choose one of {sorted(BACKENDS)}")
    module, cls = BACKENDS[name].split(":")
    return getattr(importlib.import_module(module), cls)


def make_sandbox(spec: str | Mapping[str, Any] = "local") -> Sandbox:
    """Build an unstarted sandbox from a config value.

    ``spec`` is a backend name, or a mapping ``{"backend": name, **options}``
    where ``limits`` may be a mapping of :class:`Limits` fields. A ``pool``
    entry (options of :func:`shared_pool`) is checked and otherwise ignored.

    Example:
        >>> sb = make_sandbox({"backend": "local", "limits": {"memory_mb": 512}})
        >>> sb.limits.memory_mb
        512

    """
    spec, _ = split_pool_options(spec)
    options = {"backend": spec} if isinstance(spec, str) else dict(spec)
    cls = backend_class(str(options.pop("backend", "local")))
    limits = options.get("limits")
    if isinstance(limits, Mapping):
        unknown = set(limits) - set(Limits.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown sandbox limits {sorted(unknown)}; valid: "
                             f"{sorted(Limits.__dataclass_fields__)}")
        options["limits"] = Limits(**limits)
    try:
        return cls(**options)
    except TypeError as e:
        raise ValueError(f"bad options for the {cls.__name__} sandbox: {e}") from None


async def start_sandbox(spec: str | Mapping[str, Any] = "local") -> Sandbox:
    """:func:`make_sandbox` and start it; a sandbox that fails to start is closed."""
    sandbox = make_sandbox(spec)
    try:
        await sandbox.start()
    except BaseException:
        await sandbox.aclose()
        raise
    return sandbox


def __getattr__(name: str) -> Any:
    if name in ("LocalSandbox", "DockerSandbox"):
        return backend_class(name.removesuffix("Sandbox").lower())
    raise AttributeError(f"module 'sao_gym.sandbox' has no attribute {name!r}")
