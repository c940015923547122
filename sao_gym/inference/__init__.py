"""Inference backends: token ids in, sampled token ids with logprobs out.

``HFBackend`` is imported lazily (it needs torch and transformers), so
``import sao_gym.inference`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sao_gym.inference.base import BackendClosed, InferenceBackend
from sao_gym.inference.scripted import ScriptedBackend, ScriptExhausted

if TYPE_CHECKING:  # pragma: no cover
    from sao_gym.inference.hf import BackendStats, HFBackend

__all__ = [
    "BackendClosed",
    "BackendStats",
    "HFBackend",
    "InferenceBackend",
    "ScriptExhausted",
    "ScriptedBackend",
]

_LAZY = {"HFBackend", "BackendStats"}


def __getattr__(name: str) -> Any:
    """Import torch-dependent backends on first access."""
    if name in _LAZY:
        from sao_gym.inference import hf

        return getattr(hf, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
