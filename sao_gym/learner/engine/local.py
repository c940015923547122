"""The single-device engine: the whole model on one device, trained with AdamW.

See :mod:`sao_gym.learner.engine` for what an engine does.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import math
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch

from sao_gym.learner.batching import MicroBatch
from sao_gym.learner.engine.group import SINGLE
from sao_gym.learner.engine.host_memory import release_freed_memory, release_in_backward

logger = logging.getLogger(__name__)


def keyed_by_position(optimizer_state: dict[str, Any]) -> bool:
    """Whether an optimizer state dict names parameters by position (``torch.optim``'s own)."""
    groups = optimizer_state.get("param_groups") or [{}]
    return any(isinstance(p, int) for g in groups for p in g.get("params", ()))


@contextmanager
def unstarted_kept(optimizer: torch.optim.Optimizer) -> Iterator[bool]:
    """Whether ``optimizer`` has stepped yet; an optimizer that has not stays so.

    ``torch.distributed.checkpoint``'s state-dict functions create a missing
    optimizer state with a zero-lr step (AdamW's step count becomes 1):
    reading the state of an optimizer that never stepped (the policy during
    the critic warm-up) must not change its next real step.
    """
    started = bool(optimizer.state)
    try:
        yield started
    finally:
        if not started:
            optimizer.state.clear()


def decoder_layers(module: torch.nn.Module) -> list[torch.nn.Module]:
    """A model's decoder layers (what FSDP shards on their own).

    Instances of the classes the model, or a model inside it, lists in
    ``_no_split_modules``.
    """
    names = set()
    for sub in module.modules():
        names.update(getattr(sub, "_no_split_modules", None) or ())
    return [sub for sub in module.modules() if type(sub).__name__ in names]


class ModelEngine:
    """What every engine does alike.

    Micro-batches to its device, training mode, the learning rate, and the
    optimizer step around the engine's own :meth:`clip`.
    """

    device: torch.device
    module: torch.nn.Module
    optimizer: torch.optim.Optimizer
    clip: Callable[[], float]
    """Each engine's own: clip the gradients, return their norm before clipping."""
    lora_scaling: float | None = None
    """``alpha / rank`` of a model trained through LoRA adapters; None: full fine-tuning."""

    def published(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """What :meth:`weights` hands out of the module's ``state``: a LoRA model's adapters."""
        if self.lora_scaling is None:
            return state
        from sao_gym.learner.lora import adapter_weights

        return adapter_weights(state, self.lora_scaling)

    def servable(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The plain model's state dict of the module's ``state`` (LoRA merged in)."""
        if self.lora_scaling is None:
            return state
        from sao_gym.learner.lora import merged_weights

        return merged_weights(state, self.lora_scaling)

    def to_device(self, mb: MicroBatch) -> MicroBatch:
        """``mb`` with its tensors on :attr:`device` (itself when they are there)."""
        if mb.input_ids_BT.device == self.device:
            return mb
        return dataclasses.replace(mb, **{
            f.name: getattr(mb, f.name).to(self.device) for f in dataclasses.fields(mb)
            if isinstance(getattr(mb, f.name), torch.Tensor)})

    def train(self) -> None:
        """Training mode (dropout on, where the model has any)."""
        self.module.train()

    def set_lr(self, lr: float) -> None:
        """The learning rate of the next :meth:`step`."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def checkpoint_state(self) -> dict[str, Any]:
        """Model and optimizer state held by this process, for ``torch.distributed.checkpoint``.

        Sharded tensors (``DTensor``) under FSDP, whole ones on one device:
        ``dcp.save`` writes them, ``dcp.load`` fills them in place (resharding
        to this engine's ranks), :meth:`load_checkpoint_state` applies them.
        """
        from torch.distributed.checkpoint.state_dict import get_state_dict

        with unstarted_kept(self.optimizer) as started:
            model, optimizer = get_state_dict(self.module, self.optimizer)
        return {"model": model, "optimizer": optimizer, "optimizer_started": started}

    def load_checkpoint_state(self, state: dict[str, Any]) -> None:
        """Apply a :meth:`checkpoint_state` that ``dcp.load`` filled."""
        from torch.distributed.checkpoint.state_dict import set_state_dict

        set_state_dict(self.module, self.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"])
        if not state["optimizer_started"]:
            self.optimizer.state.clear()

    def step(self, *, finite: bool = True) -> tuple[float, bool]:
        """Clip, step unless the loss (``finite``) or the gradient norm is not finite.

        Gradients are cleared either way. Returns ``(gradient norm before
        clipping, whether the weights changed)``.
        """
        norm = self.clip()
        stepped = finite and math.isfinite(norm)
        if stepped:
            self.optimizer.step()
        else:
            logger.warning("non-finite %s; optimizer step skipped",
                           "loss" if not finite else f"gradient norm ({norm})")
        self.optimizer.zero_grad(set_to_none=True)
        self.release_host_memory()
        return norm, stepped

    release_memory: bool = True
    """Whether :meth:`release_host_memory` and :meth:`release_in_backward` act (on the CPU)."""

    def release_host_memory(self) -> None:
        """On the CPU, hand the memory a pass freed back to the OS (:mod:`.host_memory`)."""
        if self.release_memory and self.device.type == "cpu":
            release_freed_memory()

    def release_in_backward(self, module: torch.nn.Module) -> None:
        """On the CPU, also release as a training pass enters each decoder layer."""
        if self.release_memory and self.device.type == "cpu":
            release_in_backward(decoder_layers(module))


class LocalEngine(ModelEngine):
    """One model on one device, trained with AdamW (the ``Engine`` protocol).

    Args:
        module: the model (already on ``device``); only parameters with
            ``requires_grad`` are optimized.
        lr: initial learning rate (the learner sets each step's).
        weight_decay: AdamW's.
        max_grad_norm: clip the gradient norm to this before a step (None: never).
        autocast: ``"bfloat16"`` runs forward passes under ``torch.autocast``;
            None: the parameters' dtype.
        device: where the module is.
        lora_scaling: ``alpha / rank`` when the module trains LoRA adapters
            (:mod:`sao_gym.learner.lora`): :meth:`weights` are the adapters,
            :meth:`save` writes the merged model.
        release_memory: on the CPU, return freed heap memory to the OS around
            training passes (:mod:`.host_memory`; a lower peak for a few % of time).

    """

    def __init__(self, module: torch.nn.Module, *, lr: float, weight_decay: float = 0.0,
                 max_grad_norm: float | None = 1.0, autocast: str | None = None,
                 device: str | torch.device = "cpu", lora_scaling: float | None = None,
                 release_memory: bool = True):
        self.module, self.lora_scaling = module, lora_scaling
        self.device = torch.device(device)
        self.release_memory = release_memory
        self.max_grad_norm = max_grad_norm
        self.autocast = autocast
        params = [p for p in module.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
        self.keeps_logits = "logits_to_keep" in inspect.signature(module.forward).parameters
        self.scores_tokens = callable(getattr(module, "score_tokens", None))
        self.group = SINGLE
        self.release_in_backward(module)

    def forward(self, *args: Any, method: str = "forward", **kwargs: Any) -> Any:
        """The module's ``method`` (the forward pass; a critic's ``values_after``).

        Inputs are already on :attr:`device`; it runs under the autocast.
        """
        context = (torch.autocast(device_type=self.device.type,
                                  dtype=getattr(torch, self.autocast))
                   if self.autocast is not None else nullcontext())
        with context:
            fn = self.module if method == "forward" else getattr(self.module, method)
            return fn(*args, **kwargs)

    def backward(self, loss: torch.Tensor) -> None:
        """Accumulate ``loss``'s gradients into the parameters."""
        self.release_host_memory()  # what the forward pass freed
        loss.backward()
        self.release_host_memory()

    def clip(self) -> float:
        """Clip the gradients to ``max_grad_norm``; their norm before clipping."""
        params = [p for group in self.optimizer.param_groups for p in group["params"]
                  if p.grad is not None]
        clip = self.max_grad_norm or math.inf
        return float(torch.nn.utils.clip_grad_norm_(params, clip)) if params else 0.0

    def weights(self) -> dict[str, torch.Tensor]:
        """The module's state dict, or a LoRA model's adapters.

        Live references: copy before the next step.
        """
        return self.published(self.module.state_dict())

    def state_dict(self) -> dict[str, Any]:
        """``{"model": ..., "optimizer": ...}``.

        The optimizer's state is keyed by parameter name, as the sharded
        engine's is, so either engine resumes the other's checkpoint.
        """
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
        )

        with unstarted_kept(self.optimizer) as started:
            optimizer = get_optimizer_state_dict(self.module, self.optimizer,
                                                 options=StateDictOptions(full_state_dict=True))
        return {"model": self.module.state_dict(),
                "optimizer": optimizer if started else {"state": {}, "param_groups": optimizer[
                    "param_groups"]}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`.

        Also one keyed by parameter position, as written before optimizer
        states were keyed by name.
        """
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_optimizer_state_dict,
        )

        self.module.load_state_dict(state["model"])
        if keyed_by_position(state["optimizer"]):
            self.optimizer.load_state_dict(state["optimizer"])
        else:
            set_optimizer_state_dict(self.module, self.optimizer, state["optimizer"],
                                     options=StateDictOptions(full_state_dict=True))
            if not state["optimizer"]["state"]:  # saved before its first step
                self.optimizer.state.clear()

    def save(self, path: str | os.PathLike[str]) -> None:
        """The module's ``save_pretrained(path)`` (a checkpoint a backend or loader reads).

        A LoRA model is written merged, as the plain model.
        """
        if self.lora_scaling is None:
            self.module.save_pretrained(str(path))
        else:
            self.module.save_pretrained(str(path),
                                        state_dict=self.servable(self.module.state_dict()))


__all__ = ["LocalEngine", "ModelEngine", "decoder_layers", "keyed_by_position", "unstarted_kept"]
