"""Weights on disk: the one format every backend reloads from.

A *weights directory* holds ``model.safetensors`` with the policy's state
dict under its Hugging Face names, or, for a policy trained through LoRA,
an *adapter directory*: PEFT's ``adapter_config.json`` and
``adapter_model.safetensors`` with the adapters alone (:func:`is_adapter`:
``X.lora_A.weight`` and ``X.lora_B.weight`` for each adapted linear layer
``X``, the scaling folded into ``B`` so that ``lora_alpha == r``). A backend
that loads adapters serves the base model plus the adapter; one that does
not gets the merged weights (:func:`merge_adapter`). It is what ``update_weights(path, ...)``
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
ADAPTER_FILE = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_NAME = "sao-gym-policy"
"""The adapter's name on a server that serves it (vLLM's ``lora_name``)."""
_ADAPTER_TAILS = (".lora_A.weight", ".lora_B.weight")
_PEFT_PREFIX = "base_model.model."


def is_adapter(weights: Mapping[str, Any] | str | os.PathLike[str]) -> bool:
    """Whether ``weights`` (a state dict, or a directory) are LoRA adapters alone."""
    if isinstance(weights, (str, os.PathLike)):
        return (Path(weights) / ADAPTER_CONFIG).is_file()
    return bool(weights) and all(k.endswith(_ADAPTER_TAILS) for k in weights)


def adapted(adapter: Mapping[str, Any]) -> list[str]:
    """The names of the weights an adapter changes (``X.weight`` for each ``X``)."""
    return sorted({k.rsplit(".lora_", 1)[0] + ".weight" for k in adapter})


def merge_adapter(base: Mapping[str, Any], adapter: Mapping[str, Any]) -> dict[str, Any]:
    """``{X.weight: base[X.weight] + B @ A}`` for each layer the adapter changes.

    ``base`` holds (at least) those weights of the model without the adapter.
    """
    import torch

    out = {}
    for name in adapted(adapter):
        module = name[: -len(".weight")]
        a, b = adapter[f"{module}.lora_A.weight"], adapter[f"{module}.lora_B.weight"]
        w = base[name]
        with torch.no_grad():
            out[name] = (w.float() + b.float() @ a.float()).to(w.dtype)
    return out


def save_adapter_dir(adapter: Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write ``adapter`` as a PEFT adapter directory (what vLLM's ``load_lora_adapter`` reads)."""
    import json

    from safetensors.torch import save_file

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    ranks = {int(t.shape[0]) for k, t in adapter.items() if k.endswith(".lora_A.weight")}
    if len(ranks) != 1:
        raise ValueError(f"an adapter needs one rank for all its layers, got {sorted(ranks)}")
    r = ranks.pop()
    targets = sorted({k.rsplit(".lora_", 1)[0].rsplit(".", 1)[-1] for k in adapter})
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": r, "lora_alpha": r,
              "lora_dropout": 0.0, "target_modules": targets, "bias": "none",
              "modules_to_save": None, "use_rslora": False, "use_dora": False,
              "fan_in_fan_out": False, "base_model_name_or_path": None}
    tensors = {_PEFT_PREFIX + k: t.detach().to("cpu").contiguous() for k, t in adapter.items()}
    tmp = out / f".{ADAPTER_FILE}.tmp"
    save_file(tensors, str(tmp))
    os.replace(tmp, out / ADAPTER_FILE)
    (out / ADAPTER_CONFIG).write_text(json.dumps(config, indent=1))
    return out


def load_weights_dir(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read every ``*.safetensors`` file of a weights directory into one state dict."""
    from safetensors.torch import load_file

    p = Path(path)
    files = sorted(p.glob("*.safetensors")) if p.is_dir() else []
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in checkpoint directory {p}")
    state: dict[str, Any] = {}
    for f in files:
        state.update({k.removeprefix(_PEFT_PREFIX) if f.name == ADAPTER_FILE else k: v
                      for k, v in load_file(str(f)).items()})
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
        """Write version ``version`` and delete the ones older than the newest ``keep``.

        Adapters (:func:`is_adapter`) are written as an adapter directory.
        """
        save = save_adapter_dir if is_adapter(state_dict) else save_weights_dir
        path = save(state_dict, self.root / f"v{version}")
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


__all__ = ["ADAPTER_CONFIG", "ADAPTER_FILE", "ADAPTER_NAME", "WEIGHTS_FILE", "Reloadable",
           "adapted", "is_adapter", "merge_adapter", "save_adapter_dir", "WeightSync",
           "WeightsPublisher", "load_weights_dir", "save_weights_dir"]
