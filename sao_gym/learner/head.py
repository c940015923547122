"""Token logprobs straight from the final hidden states, a chunk of rows at a time.

A causal LM's forward pass returns ``[B, T, vocab]`` logits; training on
them keeps the logits for the backward pass and adds their softmax and
gradient, three ``T x vocab`` tensors per micro-batch (2.4 GB at 4,096
tokens of a 49k vocabulary in fp32, 7.5 GB with Qwen's 152k) -- more than
the whole model state of a small policy. The learner needs far less: the
logprob of each action token, and its entropy as a metric.

:func:`head_logprobs` computes them from the final hidden states and the LM
head's weight, ``rows`` positions at a time, and recomputes each chunk's
logits in the backward pass (a custom autograd function), so at most one
chunk's logits exist at any time: the memory of the LM head no longer grows
with the micro-batch. Only the scored rows (action tokens) go through the
head at all.

:func:`install` gives a Hugging Face causal LM a ``score_tokens`` method
that does this after running the model's decoder, once it has checked on a
short input that the result equals the model's own forward pass (models
that transform their logits after the head -- soft-capping, scaling -- fail
the check and keep the plain path). Engines run ``score_tokens`` as a
forward method (FSDP unshards the parameters for it as for ``forward``).
"""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.nn.functional as F

LOGIT_BUDGET = 2**25
"""Logit values of one chunk (128 MB in fp32): ``rows = LOGIT_BUDGET // vocab``."""


def chunk_rows(vocab: int, budget: int = LOGIT_BUDGET) -> int:
    """Rows of one chunk for a vocabulary of ``vocab`` tokens."""
    return max(1, budget // max(1, vocab))


class _ChunkedHead(torch.autograd.Function):
    """``(logprobs [N], entropy [N])`` of ``targets`` under ``softmax((h W^T + b) / temp)``."""

    @staticmethod
    def forward(ctx: Any, hidden_NH: torch.Tensor, weight_VH: torch.Tensor,
                bias_V: torch.Tensor | None, targets_N: torch.Tensor, temperature: float,
                rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        device = hidden_NH.device.type  # the LM head's dtype under autocast, as in the model
        dtype = (torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device)
                 else hidden_NH.dtype)
        ctx.dtype = dtype
        with torch.autocast(device, enabled=False):
            return _ChunkedHead._forward(ctx, hidden_NH, weight_VH, bias_V, targets_N,
                                         temperature, rows)

    @staticmethod
    def _forward(ctx: Any, hidden_NH: torch.Tensor, weight_VH: torch.Tensor,
                 bias_V: torch.Tensor | None, targets_N: torch.Tensor, temperature: float,
                 rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        w = weight_VH.to(ctx.dtype)
        b = None if bias_V is None else bias_V.to(ctx.dtype)
        n = hidden_NH.shape[0]
        logprobs = hidden_NH.new_empty(n, dtype=torch.float32)
        entropy = hidden_NH.new_empty(n, dtype=torch.float32)
        for i in range(0, n, rows):
            x = F.linear(hidden_NH[i:i + rows].to(ctx.dtype), w, b).float() / temperature
            lse = torch.logsumexp(x, dim=-1)
            logprobs[i:i + rows] = x.gather(-1, targets_N[i:i + rows, None]).squeeze(-1) - lse
            x = x.log_softmax(dim=-1)
            entropy[i:i + rows] = -(x.exp() * x).sum(-1)
        ctx.save_for_backward(hidden_NH, weight_VH, bias_V, targets_N)
        ctx.temperature, ctx.rows = temperature, rows
        ctx.mark_non_differentiable(entropy)
        return logprobs, entropy

    @staticmethod
    def backward(ctx: Any, grad_N: torch.Tensor, _grad_entropy: Any) -> tuple[Any, ...]:
        hidden_NH, weight_VH, bias_V, targets_N = ctx.saved_tensors
        w = weight_VH.to(ctx.dtype)
        b = None if bias_V is None else bias_V.to(ctx.dtype)
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.empty_like(hidden_NH) if need_h else None
        grad_w = torch.zeros_like(weight_VH, dtype=torch.float32) if need_w else None
        grad_b = (torch.zeros_like(bias_V, dtype=torch.float32)
                  if need_b and bias_V is not None else None)
        rows = ctx.rows
        for i in range(0, hidden_NH.shape[0], rows):
            h = hidden_NH[i:i + rows].to(ctx.dtype)
            g = F.linear(h, w, b).float().div_(ctx.temperature).softmax(dim=-1)
            g.neg_().scatter_add_(-1, targets_N[i:i + rows, None],
                                  torch.ones_like(g[:, :1]))  # onehot - softmax
            g.mul_(grad_N[i:i + rows, None] / ctx.temperature)  # d logprob / d logits
            g = g.to(ctx.dtype)
            if grad_h is not None:
                grad_h[i:i + rows] = (g @ w).to(grad_h.dtype)
            if grad_w is not None:
                grad_w.add_((g.t() @ h).float())
            if grad_b is not None:
                grad_b.add_(g.float().sum(0))
        return (grad_h, None if grad_w is None else grad_w.to(weight_VH.dtype),
                None if grad_b is None else grad_b.to(bias_V.dtype), None, None, None)


def head_logprobs(hidden_NH: torch.Tensor, weight_VH: torch.Tensor, bias_V: torch.Tensor | None,
                  targets_N: torch.Tensor, temperature: float = 1.0, rows: int | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logprobs [N], entropy [N])`` of ``targets_N`` after ``hidden_NH``, fp32.

    ``logprobs[n] = log softmax((hidden[n] @ weight.T + bias) / temperature)[targets[n]]``,
    differentiable in ``hidden``, ``weight`` and ``bias``; ``entropy`` is that
    distribution's entropy (no gradient). ``rows`` positions at a time
    (default :func:`chunk_rows` of the vocabulary); the backward pass
    recomputes each chunk's logits instead of keeping them.
    """
    if hidden_NH.dim() != 2 or targets_N.shape != hidden_NH.shape[:1]:
        raise ValueError(f"hidden must be [N, H] and targets [N], got {tuple(hidden_NH.shape)} "
                         f"and {tuple(targets_N.shape)}")
    rows = rows or chunk_rows(weight_VH.shape[0])
    return _ChunkedHead.apply(hidden_NH, weight_VH, bias_V, targets_N, float(temperature), rows)


def score_tokens(model: torch.nn.Module, input_ids_BT: torch.Tensor,
                 attention_mask_BT: torch.Tensor | None, scored_BT: torch.Tensor,
                 temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logprobs [B, T], entropy [B, T])`` of the tokens where ``scored_BT > 0``; 0 elsewhere.

    Token ``t`` is scored from the hidden state at ``t - 1`` (so ``scored_BT[:, 0]``
    is ignored). Runs ``model``'s decoder, then :func:`head_logprobs` on the
    scored rows only. Bound to a model by :func:`install`.
    """
    out = model.get_decoder()(input_ids=input_ids_BT, attention_mask=attention_mask_BT)
    hidden_BTH = out[0]
    sel_BT = torch.zeros_like(scored_BT, dtype=torch.bool)
    sel_BT[:, 1:] = scored_BT[:, 1:] > 0
    head = model.get_output_embeddings()
    lp, ent = head_logprobs(hidden_BTH[:, :-1][sel_BT[:, 1:]], head.weight,
                            getattr(head, "bias", None), input_ids_BT[sel_BT], temperature)
    logprobs_BT = torch.zeros(scored_BT.shape, dtype=lp.dtype, device=lp.device)
    entropy_BT = torch.zeros_like(logprobs_BT)
    entropy_BT[sel_BT] = ent
    return logprobs_BT.masked_scatter(sel_BT, lp), entropy_BT


CHECK_TOKENS = 12
"""Length of the input :func:`install` checks the head path on."""


def install(model: torch.nn.Module, atol: float = 1e-3) -> bool:
    """Give ``model`` a ``score_tokens`` method (:func:`score_tokens`) if it is exact for it.

    The model needs ``get_decoder()`` and a linear ``get_output_embeddings()``;
    the method's logprobs of a short token sequence must equal those of the
    model's own logits within ``atol``. Returns whether it was installed.
    """
    from sao_gym.learner.batching import token_logprobs

    try:
        head = model.get_output_embeddings()
        decoder = model.get_decoder()
    except (AttributeError, NotImplementedError, ValueError):
        return False
    if not isinstance(head, torch.nn.Linear) or decoder is None or decoder is model:
        return False
    param = next(model.parameters())
    vocab = min(head.weight.shape[0], int(getattr(model.config, "vocab_size", 0) or 2**31))
    ids = torch.arange(CHECK_TOKENS, device=param.device)[None] * 7919 % vocab
    mask = torch.ones_like(ids)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            want = token_logprobs(model(input_ids=ids, attention_mask=mask).logits.float(), ids)
            got, _ = score_tokens(model, ids, mask, mask)
    except Exception:  # a model whose decoder cannot run alone
        return False
    finally:
        model.train(was_training)
    if not bool(torch.allclose(got[:, 1:], want[:, 1:], atol=atol, rtol=0)):
        return False
    model.score_tokens = types.MethodType(score_tokens, model)
    return True


__all__ = ["LOGIT_BUDGET", "chunk_rows", "head_logprobs", "install", "score_tokens"]
