"""The value model: the policy's backbone with a scalar head.

``ValueModel`` loads the causal LM's transformer body from the policy
checkpoint (its LM head is dropped) and adds ``Linear(hidden, 1)``
(weights N(0, 0.02), zero bias). Two views of the same per-position head
output:

- ``values_after_BT[b, t]`` (:meth:`ValueModel.values_after`): the value of
  the state *after* token ``t``, i.e. of the prefix ``tokens[: t + 1]`` (the
  head applied to the hidden state at ``t``). The value after a rollout's
  last action token is what a truncated rollout bootstraps from.
- ``values_BT[b, t]`` (:meth:`ValueModel.forward`, :func:`values_before`):
  the value of the state *before* token ``t`` (read from the hidden state at
  ``t - 1``), aligned with per-token logprobs; position 0 gets 0. This is
  ``V_k`` of the GAE in :mod:`~sao_gym.learner.advantages`.

``freeze="attention"`` freezes exactly the attention projections (q, k, v,
o weights and biases; the paper's frozen-attention critic: attention is where
its gradient norms blow up). Which parameters those are is listed per
architecture in :data:`ATTENTION_PROJECTIONS`; MLP/MoE blocks (experts and
router), every norm (``q_norm``/``k_norm`` included), embeddings and the head
train. An architecture not in the table falls back to "every ``nn.Linear``
inside a module whose name contains ``attn`` or ``attention``" (never a norm:
norms are not ``Linear``), with a warning; when that finds nothing the
critic refuses to build. ``freeze=None`` trains everything.

``num_layers=N`` (:meth:`ValueModel.from_pretrained`) keeps only the
checkpoint's first ``N`` decoder layers: a shallower critic whose passes cost
about ``N / layers`` of the full one's, read from the policy's middle hidden
states (the final norm is kept).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

logger = logging.getLogger(__name__)

HEAD_FILE = "value_head.pt"
META_FILE = "value_model.json"
FREEZE_MODES = (None, "attention")

_QKVO = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
ATTENTION_PROJECTIONS: dict[str, tuple[str, ...]] = {
    "qwen2": _QKVO,
    "llama": _QKVO,
    "qwen3": _QKVO,
    "qwen3_moe": _QKVO,
    "mistral": _QKVO,
}
"""``config.model_type`` -> the attention projection modules of a decoder layer
(paths relative to the layer); their ``weight`` and ``bias`` are frozen."""


def _is_attention_module_path(path: str) -> bool:
    return any("attn" in part or "attention" in part for part in path.lower().split("."))


def attention_parameter_names(model: nn.Module) -> set[str]:
    """Names of ``model``'s attention projection parameters (what ``"attention"`` freezes).

    Looked up in :data:`ATTENTION_PROJECTIONS` by ``model.config.model_type``;
    an unknown architecture falls back to the ``nn.Linear`` modules inside
    attention blocks (with a warning). Raises ``ValueError`` when nothing
    matches, rather than silently freezing nothing.
    """
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    projections = ATTENTION_PROJECTIONS.get(model_type) if model_type else None
    names: set[str] = set()
    if projections is not None:
        for name, _ in model.named_parameters():
            module, _, leaf = name.rpartition(".")
            if leaf in ("weight", "bias") and any(
                    module == p or module.endswith("." + p) for p in projections):
                names.add(name)
    else:
        for path, module in model.named_modules():
            if isinstance(module, nn.Linear) and _is_attention_module_path(path):
                names.update(f"{path}.{leaf}" for leaf, _ in module.named_parameters(
                    recurse=False))
        if names:
            logger.warning("critic freeze: architecture %r is not in ATTENTION_PROJECTIONS; "
                           "freezing the Linear layers inside attention blocks: %s",
                           model_type, sorted(names))
    if not names:
        raise ValueError(
            f"freeze='attention': found no attention projections in architecture "
            f"{model_type!r} (known: {sorted(ATTENTION_PROJECTIONS)}); add its projection "
            f"modules to sao_gym.learner.critic.ATTENTION_PROJECTIONS or use freeze=None")
    return names


def values_before(values_after_BT: torch.Tensor) -> torch.Tensor:
    """``values_BT[:, t] = values_after_BT[:, t - 1]``, 0 at position 0.

    >>> values_before(torch.tensor([[1.0, 2.0, 3.0]])).tolist()
    [[0.0, 1.0, 2.0]]
    """
    return F.pad(values_after_BT[:, :-1], (1, 0))


def _truncate_layers(config, num_layers: int, path: Path) -> int:
    """Make ``config`` describe the first ``num_layers`` decoder layers; return how many it had."""
    total = getattr(config, "num_hidden_layers", None)
    if total is None:
        raise ValueError(f"critic num_layers: the config at {path} has no num_hidden_layers")
    if not 1 <= num_layers <= total:
        raise ValueError(f"critic num_layers={num_layers}: the checkpoint at {path} has "
                         f"{total} decoder layers (choose 1..{total})")
    config.num_hidden_layers = num_layers
    layer_types = getattr(config, "layer_types", None)
    if isinstance(layer_types, list) and len(layer_types) == total:
        config.layer_types = layer_types[:num_layers]
    return total


class ValueModel(nn.Module):
    """Per-token values from a causal-LM backbone plus a scalar head."""

    def __init__(self, backbone: nn.Module, *, freeze: str | None = "attention", seed: int = 0):
        super().__init__()
        if freeze not in FREEZE_MODES:
            raise ValueError(f"freeze must be one of {FREEZE_MODES}, got {freeze!r}")
        self.backbone = backbone
        hidden = backbone.config.hidden_size
        self.head = nn.Linear(hidden, 1)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            self.head.weight.copy_(torch.randn(self.head.weight.shape, generator=gen) * 0.02)
            self.head.bias.zero_()
        self.head.to(next(backbone.parameters()).dtype)
        self.freeze = freeze
        self.apply_freeze()

    def frozen_parameter_names(self) -> set[str]:
        """Names (as in ``self.named_parameters()``) that ``self.freeze`` freezes."""
        if self.freeze is None:
            return set()
        return {"backbone." + n for n in attention_parameter_names(self.backbone)}

    def apply_freeze(self) -> None:
        """Set ``requires_grad`` according to ``self.freeze``."""
        frozen = self.frozen_parameter_names()
        for name, p in self.named_parameters():
            p.requires_grad_(name not in frozen)

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike[str],
        *,
        freeze: str | None = "attention",
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        seed: int = 0,
        num_layers: int | None = None,
    ) -> ValueModel:
        """Load from a policy checkpoint (fresh head) or a saved critic (its head).

        ``num_layers`` keeps the first ``num_layers`` decoder layers (``None``: all).
        """
        from transformers import AutoConfig, AutoModel

        path = Path(path)
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"no Hugging Face checkpoint at {path}")
        config = AutoConfig.from_pretrained(str(path))
        if num_layers is None:
            backbone = AutoModel.from_pretrained(str(path), config=config, dtype=dtype)
        else:
            total = _truncate_layers(config, num_layers, path)
            from transformers.utils import logging as hf_logging

            verbosity = hf_logging.get_verbosity()
            hf_logging.set_verbosity_error()  # the dropped layers' weights are expected
            try:
                backbone = AutoModel.from_pretrained(str(path), config=config, dtype=dtype)
            finally:
                hf_logging.set_verbosity(verbosity)
            if num_layers < total:
                logger.info("critic: the first %d of %d decoder layers of %s",
                            num_layers, total, path)
        model = cls(backbone, freeze=freeze, seed=seed)
        if (path / HEAD_FILE).exists():
            model.head.load_state_dict(torch.load(path / HEAD_FILE, weights_only=True))
        return model.to(device)

    def save_pretrained(self, path: str | os.PathLike[str],
                        state_dict: dict[str, torch.Tensor] | None = None) -> None:
        """Write the backbone (HF format) and the head, reloadable by :meth:`from_pretrained`.

        ``state_dict``: the weights to write (this model's full state dict, as
        a sharded engine gathers it); None: the model's own.
        """
        path = Path(path)
        state = self.state_dict() if state_dict is None else state_dict
        part = {n: {k[len(n) + 1:]: v for k, v in state.items() if k.startswith(n + ".")}
                for n in ("backbone", "head")}
        self.backbone.save_pretrained(str(path), state_dict=part["backbone"])
        torch.save(part["head"], path / HEAD_FILE)
        (path / META_FILE).write_text(json.dumps({"freeze": self.freeze}))

    def values_after(self, input_ids_BT: torch.Tensor,
                     attention_mask_BT: torch.Tensor) -> torch.Tensor:
        """``values_after_BT``: value of the state after each token (the prefix through it)."""
        hidden_BTH = self.backbone(
            input_ids=input_ids_BT, attention_mask=attention_mask_BT
        ).last_hidden_state
        return self.head(hidden_BTH).squeeze(-1).float().clone()  # not a view (FSDP hooks)

    def forward(self, input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor) -> torch.Tensor:
        """``values_BT``: value of the state before each token (0 at position 0)."""
        return values_before(self.values_after(input_ids_BT, attention_mask_BT))
