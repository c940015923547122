"""LoRA through PEFT: adapters in a model, and its weights as a backend loads them.

:func:`add_lora` puts PEFT's LoRA layers (``inject_adapter_in_model``) into
the linear layers ``learner.lora.target_modules`` names and leaves only the
adapters trainable (plus, for a critic, its value head and norms), so only
they reach the optimizer. The model keeps its class, its forward and its
``_no_split_modules`` (FSDP shards it as before).

A LoRA model's state dict names a target's weight ``X.base_layer.weight`` and
its adapter ``X.lora_A.default.weight`` (``A``: r x in) and
``X.lora_B.default.weight`` (``B``: out x r); the layer computes
``base(x) + scaling * B @ A @ x`` with ``scaling = alpha / rank``. Two forms
leave the learner:

- :func:`adapter_weights`: the adapters alone, ``X.lora_A.weight`` and
  ``X.lora_B.weight``, with ``scaling`` folded into ``B`` (so a receiver needs
  no config) -- what backends that load adapters get
  (:mod:`sao_gym.inference.weights`, ``is_adapter``);
- :func:`merged_weights`: the plain model's state dict, each target's weight
  ``W + scaling * B @ A`` under its original name -- what a Hugging Face
  checkpoint (``policy/`` of a checkpoint, ``sao-gym eval``) holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from sao_gym.learner.config import LoraSettings

ADAPTER = "default"
"""PEFT's adapter name in the model."""


def add_lora(model: torch.nn.Module, settings: LoraSettings, *,
             trainable: Iterable[str] = ()) -> torch.nn.Module:
    """``model`` with LoRA adapters in its target modules; only they train.

    Parameters whose name contains one of ``trainable`` (a critic's ``head``,
    ``norm``) stay trainable too. Raises ``ValueError`` when no module matches.
    """
    try:
        from peft import LoraConfig, inject_adapter_in_model
    except ImportError:
        raise ImportError("learner.lora needs PEFT: pip install 'sao-gym[lora]'") from None
    config = LoraConfig(r=settings.rank, lora_alpha=settings.alpha,
                        lora_dropout=settings.dropout,
                        target_modules=list(settings.target_modules))
    try:
        model = inject_adapter_in_model(config, model, adapter_name=ADAPTER)
    except ValueError as e:
        raise ValueError(f"learner.lora.target_modules {list(settings.target_modules)} match "
                         f"no layer of {type(model).__name__}: {e}") from None
    keep = tuple(trainable)
    for name, p in model.named_parameters():
        p.requires_grad_(".lora_" in name or any(k in name for k in keep))
    return model


def _split(name: str) -> tuple[str, str] | None:
    """``(module, "A" | "B")`` of an adapter weight's name, else None."""
    for part in ("A", "B"):
        tail = f".lora_{part}.{ADAPTER}.weight"
        if name.endswith(tail):
            return name[: -len(tail)], part
    return None


def adapter_weights(state: Mapping[str, torch.Tensor], scaling: float
                    ) -> dict[str, torch.Tensor]:
    """The adapters of a LoRA model's state dict, ``scaling`` folded into ``B`` (module docs)."""
    out = {}
    for name, tensor in state.items():
        split = _split(name)
        if split is not None:
            module, part = split
            out[f"{module}.lora_{part}.weight"] = (tensor if part == "A"
                                                   else tensor * scaling)
    return out


def merged_weights(state: Mapping[str, torch.Tensor], scaling: float
                   ) -> dict[str, torch.Tensor]:
    """The plain model's state dict of a LoRA model's: ``W + scaling * B @ A`` (module docs)."""
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    out = {}
    for name, tensor in state.items():
        split = _split(name)
        if split is not None:
            pairs.setdefault(split[0], {})[split[1]] = tensor
        else:
            out[name.replace(".base_layer.", ".")] = tensor
    for module, ab in pairs.items():
        weight = out[f"{module}.weight"]
        delta = (ab["B"].float() @ ab["A"].float()) * scaling
        out[f"{module}.weight"] = (weight.float() + delta).to(weight.dtype)
    return out


__all__ = ["ADAPTER", "add_lora", "adapter_weights", "merged_weights"]
