"""Sandboxes for model-written code.

- :class:`~sao_gym.sandbox.base.Sandbox`: the protocol; :class:`ExecResult`,
  :class:`Limits` and the errors live in :mod:`sao_gym.sandbox.base`.
- ``LocalSandbox`` (bubblewrap, the default) and ``DockerSandbox`` (the
  ``docker`` extra), imported lazily.
- :class:`~sao_gym.sandbox.pool.SandboxPool`: warm, bounded, single-use;
  :func:`shared_pool` (one per spec and event loop) and
  :class:`EpisodeSandbox` (an env's lease, from reset to close).
- :func:`make_sandbox`, :func:`start_sandbox` (:mod:`~sao_gym.sandbox.factory`): a
  sandbox from a config value (:mod:`~sao_gym.sandbox.spec`: what the value holds).

What each backend isolates, and what not: docs/sandbox.md.
"""

from __future__ import annotations

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
from sao_gym.sandbox.factory import BACKENDS, backend_class, make_sandbox, start_sandbox
from sao_gym.sandbox.pool import (
    EpisodeSandbox,
    SandboxLease,
    SandboxPool,
    aclose_shared_pools,
    shared_pool,
)
from sao_gym.sandbox.spec import POOL_OPTIONS, split_pool_options

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


def __getattr__(name: str) -> Any:
    if name in ("LocalSandbox", "DockerSandbox"):
        return backend_class(name.removesuffix("Sandbox").lower())
    raise AttributeError(f"module 'sao_gym.sandbox' has no attribute {name!r}")
