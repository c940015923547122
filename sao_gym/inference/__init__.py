"""Inference backends: token ids in, sampled token ids with logprobs out.

- :class:`HFBackend`: in-process transformers with continuous batching;
- :class:`VLLMServerBackend`: ``vllm serve`` / ``sao-gym serve`` servers over
  HTTP (aiohttp), several at once (:class:`Router`);
- :class:`VLLMBackend`: in-process vLLM (``AsyncLLM``);
- :class:`ScriptedBackend`: replays given outputs (tests).

The others are imported lazily (torch, transformers, vllm), so
``import sao_gym.inference`` stays cheap. docs/inference.md says which to use when.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from sao_gym.inference.base import BackendClosed, InferenceBackend, InferenceError
from sao_gym.inference.scripted import ScriptedBackend, ScriptExhausted

if TYPE_CHECKING:  # pragma: no cover
    from sao_gym.inference.hf.backend import BackendStats, HFBackend
    from sao_gym.inference.launch import LocalServers
    from sao_gym.inference.router import NoServersAvailable, Router
    from sao_gym.inference.vllm import VLLMBackend
    from sao_gym.inference.vllm_server import VLLMServerBackend

__all__ = [
    "BackendClosed",
    "BackendStats",
    "HFBackend",
    "InferenceBackend",
    "InferenceError",
    "LocalServers",
    "NoServersAvailable",
    "Router",
    "ScriptExhausted",
    "ScriptedBackend",
    "VLLMBackend",
    "VLLMServerBackend",
]

_LAZY = {"HFBackend": "hf.backend", "BackendStats": "hf.backend", "LocalServers": "launch",
         "NoServersAvailable": "router", "Router": "router", "VLLMBackend": "vllm",
         "VLLMServerBackend": "vllm_server"}


def __getattr__(name: str) -> Any:
    """Import the heavier backends on first access."""
    if name in _LAZY:
        return getattr(importlib.import_module(f"sao_gym.inference.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
