"""Weights on disk: the one format every backend reloads from.

A *weights directory* holds ``model.safetensors`` with the policy's state
dict under its Hugging Face names. It is what ``update_weights(path, ...)``
takes, what ``vllm serve`` reloads with ``reload_weights`` and what
``sao-gym serve`` reads. :class:`WeightsPublisher` writes one per version for
backends that run in other processes, keeping only the newest few.

:class:`WeightSync` is what both vLLM backends (in-process and over HTTP) do
to serve a new policy version while requests keep running: turn the new
weights into a weights directory (a state dict is published; a path is taken
as it is), then, for each engine, pause it keeping its requests -> reload
from the directory -> set the version -> resume (always).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

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


class Reloadable(Protocol):
    """One vLLM engine's weight-update calls (in-process or over HTTP)."""

    async def pause(self) -> None:
        """Stop sampling, keeping the requests (their tokens so far are flushed)."""

    async def reload(self, path: str) -> None:
        """Reload the weights from a weights directory."""

    async def set_version(self, version: int) -> None:
        """Tag what it samples from now on with ``version``."""

    async def resume(self) -> None:
        """Sample again."""


class WeightSync:
    """The weights directory of a backend and the reload sequence of its engines.

    Args:
        sync_dir: where state dicts are published (must be readable by the
            engines); None: a temporary directory removed by :meth:`close`.

    """

    def __init__(self, sync_dir: str | os.PathLike[str] | None = None):
        self._own = sync_dir is None
        root = Path(tempfile.mkdtemp(prefix="sao-gym-weights-") if sync_dir is None else sync_dir)
        self.publisher = WeightsPublisher(root)

    async def path(self, weights: Mapping[str, Any] | str | os.PathLike[str],
                   version: int) -> str:
        """The weights directory of ``weights``: a state dict is published first."""
        if isinstance(weights, (str, os.PathLike)):
            return str(weights)
        return str(await asyncio.to_thread(self.publisher.publish, weights, version))

    @staticmethod
    async def reload(engine: Reloadable, path: str, version: int) -> None:
        """Pause ``engine`` (requests kept) -> reload ``path`` -> set ``version`` -> resume.

        The resume runs whatever happens, so a failed reload never leaves the
        engine paused with requests waiting.
        """
        await engine.pause()
        try:
            await engine.reload(path)
            await engine.set_version(int(version))
        finally:
            await engine.resume()

    def close(self) -> None:
        """Remove the directory if it is this object's own."""
        if self._own:
            shutil.rmtree(self.publisher.root, ignore_errors=True)


__all__ = ["WEIGHTS_FILE", "Reloadable", "WeightSync", "WeightsPublisher", "load_weights_dir",
           "save_weights_dir"]
