"""The sharded engine: one model over the ranks of a process group, with PyTorch FSDP2.

Each decoder layer (the classes a model names in ``_no_split_modules``) is
its own ``fully_shard`` unit, then the whole model; every rank holds
``1 / ranks`` of the parameters, gradients and AdamW state, and all-gathers a
unit's parameters for its forward and backward passes. Every rank runs the
same learner code on its share of the micro-batches
(:class:`~sao_gym.learner.engine.group.TorchRankGroup`); the engine turns
FSDP's mean over ranks into the sum the learner's loss normalisation
assumes, clips by the global gradient norm, and gathers full weights and
state dicts on rank 0.

Methods other than ``forward`` that the learner calls (the critic's
``values_after``) are registered with ``register_fsdp_forward_method`` so
that they unshard the parameters as ``forward`` does.

Collectives: :meth:`FSDPEngine.step`, :meth:`~FSDPEngine.weights`,
:meth:`~FSDPEngine.state_dict`, :meth:`~FSDPEngine.load_state_dict` and
:meth:`~FSDPEngine.save` must be called on every rank together.
"""

from __future__ import annotations

import inspect
import math
import os
from typing import Any

import torch

from sao_gym.learner.engine.group import TorchRankGroup
from sao_gym.learner.engine.local import ModelEngine, decoder_layers

FORWARD_METHODS = ("values_after", "score_tokens")
"""Methods besides ``forward`` that run the model (registered with FSDP)."""


class FSDPEngine(ModelEngine):
    """A model sharded over ``group``'s ranks with FSDP2, trained with AdamW.

    Args:
        module: the model, on ``device`` and identical on every rank (loaded
            from one checkpoint); sharded in place. Only parameters with
            ``requires_grad`` are optimized.
        group: the ranks (the default process group, initialised by the caller).
        lr, weight_decay, max_grad_norm: as :class:`~sao_gym.learner.engine.local.LocalEngine`.
        mixed_precision: ``"bfloat16"``: FSDP's ``MixedPrecisionPolicy`` (bf16
            compute, fp32 gradient reduction, fp32 master weights); None: the
            parameters' dtype.
        device: this rank's device (``cpu``, ``cuda:R``).
        lora_scaling: as :class:`~sao_gym.learner.engine.local.LocalEngine`'s
            (the adapters alone are gathered for :meth:`weights`).
        offload: keep the shards (parameters, gradients, AdamW state) in host
            memory, FSDP2's ``CPUOffloadPolicy`` (GPUs).
        release_memory: as :class:`~sao_gym.learner.engine.local.LocalEngine`'s.

    """

    def __init__(self, module: torch.nn.Module, group: TorchRankGroup, *, lr: float,
                 weight_decay: float = 0.0, max_grad_norm: float | None = 1.0,
                 mixed_precision: str | None = None, device: str | torch.device = "cpu",
                 lora_scaling: float | None = None, offload: bool = False,
                 release_memory: bool = True):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import (
            CPUOffloadPolicy,
            MixedPrecisionPolicy,
            OffloadPolicy,
            fully_shard,
            register_fsdp_forward_method,
        )

        self.device, self.group = torch.device(device), group
        self.release_memory = release_memory
        self.lora_scaling = lora_scaling
        self.max_grad_norm = max_grad_norm
        self.keeps_logits = "logits_to_keep" in inspect.signature(module.forward).parameters
        self.scores_tokens = callable(getattr(module, "score_tokens", None))
        mesh = init_device_mesh(self.device.type, (group.size,))
        policy = (MixedPrecisionPolicy(param_dtype=getattr(torch, mixed_precision),
                                       reduce_dtype=torch.float32)
                  if mixed_precision else MixedPrecisionPolicy())
        where = CPUOffloadPolicy() if offload else OffloadPolicy()
        self.release_in_backward(module)
        for unit in decoder_layers(module):
            fully_shard(unit, mesh=mesh, mp_policy=policy, offload_policy=where)
        fully_shard(module, mesh=mesh, mp_policy=policy, offload_policy=where)
        for name in FORWARD_METHODS:
            if callable(getattr(module, name, None)):
                register_fsdp_forward_method(module, name)
        self.module = module
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=lr, weight_decay=weight_decay)

    def forward(self, *args: Any, method: str = "forward", **kwargs: Any) -> Any:
        """The module's ``method`` on inputs on :attr:`device` (parameters gathered by FSDP)."""
        fn = self.module if method == "forward" else getattr(self.module, method)
        return fn(*args, **kwargs)

    def backward(self, loss: torch.Tensor) -> None:
        """Accumulate this rank's part of the gradient.

        FSDP's reduction sums the ranks' parts divided by the number of ranks:
        the loss is scaled back up by it.
        """
        self.release_host_memory()  # what the forward pass freed
        (loss * self.group.size).backward()
        self.release_host_memory()

    def clip(self) -> float:
        """Clip by the global gradient norm (over every rank's shards); that norm."""
        from torch.distributed.tensor import DTensor

        params = [p for p in self.params if p.grad is not None]
        if not params:
            return 0.0
        total = torch.nn.utils.get_total_norm([p.grad for p in params], 2.0)
        if isinstance(total, DTensor):
            total = total.full_tensor()
        norm = float(total)
        if self.max_grad_norm is not None and math.isfinite(norm):
            torch.nn.utils.clip_grads_with_norm_(params, self.max_grad_norm, total)
        return norm

    def _options(self, **kwargs: Any) -> Any:
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        return StateDictOptions(full_state_dict=True, **kwargs)

    def weights(self) -> dict[str, torch.Tensor]:
        """The full weights (a LoRA model's adapters) on rank 0, on the CPU; ``{}`` elsewhere."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        lora = self.lora_scaling is not None  # the frozen base is not gathered
        return self.published(get_model_state_dict(
            self.module, options=self._options(cpu_offload=True, ignore_frozen_params=lora)))

    def _full_weights(self) -> dict[str, torch.Tensor]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return get_model_state_dict(self.module, options=self._options(cpu_offload=True))

    def state_dict(self) -> dict[str, Any]:
        """Full model and optimizer state on rank 0 (``{}`` parts elsewhere)."""
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        from sao_gym.learner.engine.local import unstarted_kept

        with unstarted_kept(self.optimizer) as started:
            optimizer = get_optimizer_state_dict(self.module, self.optimizer,
                                                 options=self._options(cpu_offload=True))
        if not started and optimizer:
            optimizer = {"state": {}, "param_groups": optimizer["param_groups"]}
        return {"model": self._full_weights(), "optimizer": optimizer}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (read on rank 0, sent to every rank)."""
        from torch.distributed.checkpoint.state_dict import (
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        from sao_gym.learner.engine.local import keyed_by_position

        if self.group.rank == 0 and keyed_by_position(state["optimizer"]):
            raise ValueError("this checkpoint's optimizer state names parameters by position "
                             "(written before engines named them): resume it with engine local")
        options = self._options(broadcast_from_rank0=True)
        set_model_state_dict(self.module, state["model"], options=options)
        has_state = self.group.rank == 0 and bool(state["optimizer"]["state"])
        started = self.group.max([float(has_state)])
        set_optimizer_state_dict(self.module, self.optimizer, state["optimizer"],
                                 options=options)
        if not started[0]:  # saved before its first step
            self.optimizer.state.clear()

    def save(self, path: str | os.PathLike[str]) -> None:
        """Rank 0 writes the whole model (LoRA merged) with its ``save_pretrained``."""
        full = self._full_weights()
        if self.group.rank == 0:
            self.module.save_pretrained(str(path), state_dict=self.servable(full))


__all__ = ["FORWARD_METHODS", "FSDPEngine"]
