"""Model engines: everything of one trained model that touches devices, ranks and optimizers.

The learner's algorithm code never moves a tensor, builds an optimizer or
saves a file: it asks an :class:`Engine` (one for the policy, one for the
critic) to

- put a micro-batch on the model's device (:meth:`Engine.to_device`) and run
  the model on it under the configured autocast (calling the engine);
- back-propagate a loss and take one optimizer step with gradient clipping
  (:meth:`Engine.backward`, :meth:`Engine.step`) at the rate the learner's
  schedule set (:meth:`Engine.set_lr`);
- hand out the weights an inference backend loads (:meth:`Engine.weights`),
  its full state for checkpoints (:meth:`Engine.state_dict`), and save the
  model for serving (:meth:`Engine.save`);
- say which micro-batches this process runs and combine what the processes
  computed (:attr:`Engine.group`, a :class:`~sao_gym.learner.engine.group.RankGroup`).

Implementations:

- :class:`~sao_gym.learner.engine.local.LocalEngine`: the whole model on one
  device (``cpu``, ``cuda:0``), AdamW; its group is this process alone;
- :class:`~sao_gym.learner.engine.fsdp.FSDPEngine`: the model sharded over
  ranks with PyTorch FSDP2 (``fully_shard``); every rank runs the same
  learner code on its share of the micro-batches.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Protocol

import torch

from sao_gym.learner import head
from sao_gym.learner.batching import MicroBatch
from sao_gym.learner.engine.group import SINGLE, RankGroup, TorchRankGroup
from sao_gym.learner.engine.local import LocalEngine

if TYPE_CHECKING:
    from sao_gym.learner.config import LearnerConfig, LoraSettings


class Engine(Protocol):
    """What the learner needs of a trained model (module docs)."""

    device: torch.device
    """Where the model's forward pass and the loss run."""
    keeps_logits: bool
    """The model's forward takes ``logits_to_keep`` (scores only the last positions)."""
    scores_tokens: bool
    """The model has a ``score_tokens`` method (:mod:`sao_gym.learner.head`)."""
    group: RankGroup
    """The processes that train this model together (one: :data:`SINGLE`)."""

    def forward(self, *args: Any, method: str = "forward", **kwargs: Any) -> Any:
        """Run the model (or its ``method``) on inputs on :attr:`device`."""

    def to_device(self, mb: MicroBatch) -> MicroBatch:
        """``mb`` on :attr:`device`."""

    def train(self) -> None:
        """Training mode."""

    def backward(self, loss: torch.Tensor) -> None:
        """Accumulate ``loss``'s gradients (a sum over the group's ranks)."""

    def set_lr(self, lr: float) -> None:
        """The learning rate of the next :meth:`step`."""

    def step(self, *, finite: bool = True) -> tuple[float, bool]:
        """Clip and step (skipped for a non-finite loss or norm): ``(norm, stepped)``."""

    def weights(self) -> dict[str, torch.Tensor]:
        """The weights an inference backend loads: all of them, or a LoRA model's adapters."""

    def state_dict(self) -> dict[str, Any]:
        """``{"model": ..., "optimizer": ...}`` for checkpoints."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the model where a loader or a backend reads it."""



def checkpoint_activations(model: torch.nn.Module) -> int:
    """Turn on gradient checkpointing in every transformers model inside ``model``.

    Non-reentrant (it works with frozen parameters and FSDP); returns how
    many models it turned on (a critic's backbone counts as one).
    """
    models: list[tuple[str, torch.nn.Module]] = []  # the outermost ones
    for name, m in model.named_modules():
        if _checkpointing_switch(m) is not None and not any(
                name == outer or name.startswith(outer + ".") or outer == ""
                for outer, _ in models):
            models.append((name, m))
    for _, m in models:
        _checkpointing_switch(m)({"use_reentrant": False})
        if getattr(m, "config", None) is not None:
            m.config.use_cache = False
    return len(models)


def _checkpointing_switch(m: torch.nn.Module) -> Any:
    """A model's way to turn gradient checkpointing on (transformers renamed it in 5.x)."""
    for name in ("activation_checkpointing_enable", "gradient_checkpointing_enable"):
        if callable(getattr(m, name, None)):
            return getattr(m, name)
    return None


CRITIC_TRAINABLE = ("head", "norm")
"""Parameters of a critic with LoRA that stay trainable besides its adapters."""


def _prepare(model: torch.nn.Module, config: LearnerConfig, lora: LoraSettings | None
             ) -> torch.nn.Module:
    """``model`` with ``lora`` adapters and the config's memory settings (before any sharding)."""
    if lora is not None:
        from sao_gym.learner.lora import add_lora

        model = add_lora(model, lora, trainable=CRITIC_TRAINABLE
                         if hasattr(model, "values_after") else ())
    if config.gradient_checkpointing and not checkpoint_activations(model):
        raise ValueError(f"gradient_checkpointing: {type(model).__name__} holds no transformers "
                         "model to checkpoint")
    if not hasattr(model, "values_after"):  # a policy: score its tokens chunk by chunk
        head.install(model)
    return model


def local_engine(model: torch.nn.Module, config: LearnerConfig, lr: float, *,
                 lora: LoraSettings | None = None) -> LocalEngine:
    """``model`` (on ``config.device``) in a :class:`LocalEngine` with the config's settings.

    ``lora``: train adapters in it (:mod:`sao_gym.learner.lora`) instead of all of it.
    """
    model = _prepare(model, config, lora)
    return LocalEngine(model, lr=lr, weight_decay=config.weight_decay,
                       max_grad_norm=config.max_grad_norm, autocast=config.autocast,
                       device=config.device, lora_scaling=lora.scaling if lora else None,
                       release_memory=config.release_host_memory)


def fsdp_engine(model: torch.nn.Module, config: LearnerConfig, lr: float, *,
                lora: LoraSettings | None = None) -> Engine:
    """``model`` sharded over the ranks of the default process group, with the config's settings.

    The caller starts the ``config.ranks`` processes and their process group.
    ``lora``: as :func:`local_engine`.
    """
    import torch.distributed as dist

    from sao_gym.learner.engine.fsdp import FSDPEngine

    if not dist.is_initialized() or dist.get_world_size() != config.ranks:
        raise RuntimeError(f"engine fsdp needs a process group of learner.ranks={config.ranks} "
                           "ranks, started before the learner is built")
    group = TorchRankGroup(device=rank_device(config.device))
    return FSDPEngine(_prepare(model, config, lora), group, lr=lr,
                      weight_decay=config.weight_decay, max_grad_norm=config.max_grad_norm,
                      mixed_precision=config.autocast, device=group.device,
                      lora_scaling=lora.scaling if lora else None, offload=config.cpu_offload,
                      release_memory=config.release_host_memory)


def rank_device(device: str) -> str:
    """The device of this rank: its own GPU for ``cuda`` (``LOCAL_RANK``), else ``device``."""
    return f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if device == "cuda" else device


__all__ = ["SINGLE", "Engine", "LocalEngine", "RankGroup", "TorchRankGroup",
           "fsdp_engine", "local_engine", "rank_device"]
