"""The value model: the policy's backbone with a scalar head.

``ValueModel`` loads the causal LM's transformer body from the policy
checkpoint (its LM head is dropped) and adds ``Linear(hidden, 1)``
(weights N(0, 0.02), zero bias). ``values_BT[b, t]`` is the value of the
state *before* token ``t`` (read from the hidden state at ``t - 1``), aligned
with per-token logprobs; position 0 gets 0.

``freeze="attention"`` freezes every attention projection (the paper's
frozen-attention critic: attention is where its gradient norms blow up);
MLP/MoE blocks, norms, embeddings and the head train. ``freeze=None`` trains
everything.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

HEAD_FILE = "value_head.pt"
META_FILE = "value_model.json"
FREEZE_MODES = (None, "attention")


def is_attention_parameter(name: str) -> bool:
    """Whether a parameter belongs to an attention block (by its module path)."""
    parts = name.lower().split(".")
    return any("attn" in p or "attention" in p for p in parts[:-1])


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

    def apply_freeze(self) -> None:
        """Set ``requires_grad`` according to ``self.freeze``."""
        for name, p in self.backbone.named_parameters():
            p.requires_grad_(not (self.freeze == "attention" and is_attention_parameter(name)))

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike[str],
        *,
        freeze: str | None = "attention",
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        seed: int = 0,
    ) -> ValueModel:
        """Load from a policy checkpoint (fresh head) or a saved critic (its head)."""
        from transformers import AutoModel

        path = Path(path)
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"no Hugging Face checkpoint at {path}")
        backbone = AutoModel.from_pretrained(str(path), dtype=dtype)
        model = cls(backbone, freeze=freeze, seed=seed)
        if (path / HEAD_FILE).exists():
            model.head.load_state_dict(torch.load(path / HEAD_FILE, weights_only=True))
        return model.to(device)

    def save_pretrained(self, path: str | os.PathLike[str]) -> None:
        """Write the backbone (HF format) and the head, reloadable by :meth:`from_pretrained`."""
        path = Path(path)
        self.backbone.save_pretrained(str(path))
        torch.save(self.head.state_dict(), path / HEAD_FILE)
        (path / META_FILE).write_text(json.dumps({"freeze": self.freeze}))

    def forward(self, input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor) -> torch.Tensor:
        """``values_BT``: value of the state before each token (0 at position 0)."""
        hidden_BTH = self.backbone(
            input_ids=input_ids_BT, attention_mask=attention_mask_BT
        ).last_hidden_state
        values_BT = self.head(hidden_BTH[:, :-1]).squeeze(-1).float()
        return F.pad(values_BT, (1, 0))
