"""Weights on disk: the one format every backend reloads from.

A *weights directory* holds ``model.safetensors`` with the policy's state
dict under its Hugging Face names. It is what ``update_weights(path, ...)``
takes, what ``vllm serve`` reloads with ``reload_weights`` and what
``sao-gym serve`` reads. :class:`WeightsPublisher` writes one per version for
backends that run in other processes, keeping only the newest few.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

WEIGHTS_FILE = "model.safetensors"


def load_weights_dir(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read every ``*.safetensors`` file of a weights directory into one state dict."""
    from safetensors.torch import load_file

    p = Path(path)
    files = sorted(p.glob("*.safetensors")) if p.is_dir() else []
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in checkpoint directory {p}")
    state: dict[str, Any] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state


def save_weights_dir(state_dict: Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write ``state_dict`` to ``path/model.safetensors`` atomically; return ``path``.

    Tensors that share storage with an earlier one (tied embeddings) are
    written once, under the first name: loaders tie them again. The file is
    written under a temporary name and renamed, so a reader never sees half
    of it.
    """
    from safetensors.torch import save_file

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    seen: set[tuple[int, int]] = set()
    tensors = {}
    for name, t in state_dict.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset())
        if key in seen:
            continue
        seen.add(key)
        tensors[name] = t.detach().to("cpu").contiguous()
    tmp = out / f".{WEIGHTS_FILE}.tmp"
    save_file(tensors, str(tmp))
    os.replace(tmp, out / WEIGHTS_FILE)
    return out


class WeightsPublisher:
    """Writes each new policy version to ``root/v{version}``, keeping the newest ``keep``.

    Backends in other processes (servers) reload from the path it returns;
    the directory must be readable by them (the same host, or a shared file
    system).
    """

    def __init__(self, root: str | os.PathLike[str], *, keep: int = 2):
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.root, self.keep = Path(root), keep
        self._published: list[Path] = []

    def publish(self, state_dict: Mapping[str, Any], version: int) -> Path:
        """Write version ``version`` and delete the ones older than the newest ``keep``."""
        path = save_weights_dir(state_dict, self.root / f"v{version}")
        if path in self._published:
            self._published.remove(path)
        self._published.append(path)
        while len(self._published) > self.keep:
            old = self._published.pop(0)
            shutil.rmtree(old, ignore_errors=True)
        logger.debug("published weights version %d to %s", version, path)
        return path


__all__ = ["WEIGHTS_FILE", "WeightsPublisher", "load_weights_dir", "save_weights_dir"]
