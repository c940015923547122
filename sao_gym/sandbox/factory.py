"""Sandboxes from config values: :func:`make_sandbox`, :func:`start_sandbox`.

:data:`BACKENDS` names each backend's class (imported when first used, so
the docker extra is needed only for ``docker``).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from sao_gym.sandbox.base import Limits, Sandbox
from sao_gym.sandbox.spec import split_pool_options

BACKENDS = {
    "local": "sao_gym.sandbox.local:LocalSandbox",
    "docker": "sao_gym.sandbox.docker:DockerSandbox",
}
"""Backend name -> ``module:Class``."""


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
