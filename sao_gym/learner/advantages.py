"""Advantage estimators and critic diagnostics as pure functions.

- :func:`skip_observation_gae`: SAO's token-level GAE over action tokens only
  (PAPER.md 2, Eq. 4-5), with :func:`length_adaptive_lambda` for the policy's
  lambda (VAPO: ``1 - 1/(alpha * l)``).
- :func:`group_normalized_advantages`: GRPO's group baseline (baselines).
- :class:`RunningMeanBaseline`: the single-rollout running-mean baseline of
  the paper's ablations (8 rewards per prompt, or 128 global).
- :func:`explained_variance`: the critic diagnostic ``1 - Var(R-V)/Var(R)``.

Tensors are ``[B, T]`` over right-padded packed rollouts with ``mask_BT``
marking action tokens (nonzero = sampled by the policy), as in
:mod:`sao_gym.learner.losses`.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Hashable, Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "RunningMeanBaseline",
    "explained_variance",
    "group_normalized_advantages",
    "length_adaptive_lambda",
    "skip_observation_gae",
]


def skip_observation_gae(
    rewards_BT: Tensor,
    values_BT: Tensor,
    mask_BT: Tensor,
    *,
    gamma: float = 1.0,
    lam: float | Tensor,
    bootstrap_B: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Token-level GAE over action tokens, skipping observations (PAPER.md Eq. 4-5).

    For the action tokens ``k = 0 .. n-1`` of a row, in order::

        delta_k = r_k + gamma * V_{k+1} - V_k
        A_k     = delta_k + gamma * lam * A_{k+1}
        R_k     = A_k + V_k

    with ``V_n = bootstrap_B[b]`` (the value after the last token: 0 or None
    for a terminated rollout, the critic's estimate for a truncated one) and
    ``A_n = 0``. The Bellman link runs from the last token of one action
    directly to the first token of the next, so observation tokens neither
    receive nor pass on advantage; they (and padding) get advantage 0 and
    return 0, meaning no value target. ``lam`` is a float or a per-sequence
    tensor ``[B]`` (see :func:`length_adaptive_lambda`).

    Rewards must sit on action tokens (the outcome reward on the last one):
    a nonzero reward anywhere else raises ``ValueError``, because dropping it
    silently would be a bug and moving it would hide a collation bug.

    Values at non-action positions are never read. No gradient flows
    (inputs are detached). Computed in float64 with a log-depth parallel scan
    (``ceil(log2 T)`` vectorised steps, no Python loop over tokens); the
    outputs take the promoted dtype of ``rewards_BT`` and ``values_BT``.
    """
    if not (rewards_BT.shape == values_BT.shape == mask_BT.shape) or values_BT.dim() != 2:
        raise ValueError(
            f"rewards, values and mask must share one [B, T] shape; got "
            f"{tuple(rewards_BT.shape)}, {tuple(values_BT.shape)}, {tuple(mask_BT.shape)}"
        )
    B, T = values_BT.shape
    out_dtype = torch.promote_types(rewards_BT.dtype, values_BT.dtype)
    f64 = dict(dtype=torch.float64, device=values_BT.device)
    with torch.no_grad():
        mask = mask_BT.bool()
        rewards = rewards_BT.detach().to(torch.float64)
        if (torch.where(mask, 0.0, rewards) != 0).any():
            raise ValueError(
                "skip_observation_gae: nonzero reward on a non-action position; put each "
                "reward on an action token (the outcome reward on the last action token)"
            )
        values = torch.where(mask, values_BT.detach().to(torch.float64), 0.0)
        lam_B = torch.as_tensor(lam, **f64).reshape(-1)
        if lam_B.numel() not in (1, B):
            raise ValueError(f"lam must be a float or a [B] tensor; got {tuple(lam_B.shape)}")
        lam_B = lam_B.expand(B)
        if bootstrap_B is None:
            bootstrap_B = torch.zeros(B, **f64)
        bootstrap_B = torch.as_tensor(bootstrap_B, **f64).reshape(B)

        # V of the next action token after each position (bootstrap after the last one).
        positions_BT = torch.where(mask, torch.arange(T, device=mask.device), T)
        suffix_min_BT = positions_BT.flip(-1).cummin(dim=-1).values.flip(-1)
        next_pos_BT = F.pad(suffix_min_BT[:, 1:], (0, 1), value=T)
        values_ext = torch.cat([values, bootstrap_B[:, None]], dim=-1)
        next_values_BT = values_ext.gather(-1, next_pos_BT)
        delta_BT = torch.where(mask, rewards + gamma * next_values_BT - values, 0.0)

        # Suffix scan of A_t = b_t + a_t * A_{t+1}, A_T = 0. Action tokens: (gamma*lam, delta);
        # other tokens are the identity (1, 0), so A passes through them unchanged.
        # Hillis-Steele doubling: after stride s, (a_t, b_t) means A_t = b_t + a_t * A_{t+s}.
        a_BT = torch.where(mask, (gamma * lam_B)[:, None], 1.0)
        b_BT = delta_BT
        stride = 1
        while stride < T:
            b_BT = b_BT + a_BT * F.pad(b_BT[:, stride:], (0, stride))
            a_BT = a_BT * F.pad(a_BT[:, stride:], (0, stride))
            stride *= 2
        advantages_BT = torch.where(mask, b_BT, 0.0)
        returns_BT = torch.where(mask, b_BT + values, 0.0)
    return advantages_BT.to(out_dtype), returns_BT.to(out_dtype)


def length_adaptive_lambda(
    num_action_tokens_B: Tensor | Iterable[int], alpha: float = 1.5
) -> Tensor:
    """VAPO's length-adaptive GAE lambda, ``1 - 1/(alpha * l)``, per sequence.

    ``l`` is the number of action tokens of each rollout (our reading for
    multi-turn traces; PAPER.md 2 leaves it open), so the effective horizon
    ``sum_k lambda^k = alpha * l`` scales with the rollout. Where
    ``alpha * l < 1`` (including ``l <= 0``) lambda would be negative or
    undefined; it is 0 there (one-step TD). Returns float64 ``[B]``: float32
    would lose most digits of ``1 - lambda`` for long rollouts.

    >>> length_adaptive_lambda(torch.tensor([0, 1, 2, 10_000])).tolist()
    [0.0, 0.33333333333333337, 0.6666666666666667, 0.9999333333333333]
    """
    if alpha <= 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    scaled_B = alpha * torch.as_tensor(num_action_tokens_B, dtype=torch.float64)
    safe_B = torch.where(scaled_B >= 1, scaled_B, 1.0)
    return torch.where(scaled_B >= 1, 1.0 - 1.0 / safe_B, 0.0)


def group_normalized_advantages(
    rewards_B: Tensor,
    group_ids_B: Tensor,
    *,
    eps: float = 1e-6,
    normalize_std: bool = True,
) -> Tensor:
    """GRPO advantages: ``(r - mean of its group) / (std of its group + eps)``.

    ``group_ids_B`` holds any integer id per rollout (rollouts of one prompt
    share it; ids need not be contiguous or sorted; for consecutive groups of
    G use ``torch.arange(B) // G``). The std is the **unbiased** (sample,
    Bessel-corrected) std, as ``torch.std`` and the common GRPO code use; a
    group of one has std 0 and advantage 0. With ``normalize_std=False`` only
    the mean is subtracted (Dr. GRPO). Returns ``[B]`` in the rewards' dtype
    (float32 for integer rewards).
    """
    if rewards_B.dim() != 1 or group_ids_B.shape != rewards_B.shape:
        raise ValueError(
            f"rewards_B and group_ids_B must both be [B]; got {tuple(rewards_B.shape)} "
            f"and {tuple(group_ids_B.shape)}"
        )
    out_dtype = rewards_B.dtype if rewards_B.is_floating_point() else torch.float32
    _, group_B = torch.unique(group_ids_B, return_inverse=True)
    num_groups = int(group_B.max()) + 1 if group_B.numel() else 0
    rewards = rewards_B.detach().to(torch.float64)
    zeros_G = torch.zeros(num_groups, dtype=torch.float64, device=rewards.device)
    count_G = zeros_G.index_add(0, group_B, torch.ones_like(rewards))
    mean_G = zeros_G.index_add(0, group_B, rewards) / count_G
    centered_B = rewards - mean_G[group_B]
    if not normalize_std:
        return centered_B.to(out_dtype)
    var_G = zeros_G.index_add(0, group_B, centered_B**2) / (count_G - 1).clamp(min=1)
    return (centered_B / (var_G.sqrt()[group_B] + eps)).to(out_dtype)


class RunningMeanBaseline:
    """Single-rollout baseline: advantage = reward - mean of recent rewards.

    With ``per_prompt=True`` the window holds the last ``window`` rewards of
    the same prompt (the paper's ablation: 8); with ``per_prompt=False`` the
    last ``window`` rewards overall, whatever the prompt (the paper's online
    experiment: 128). The mean is taken **before** the current reward is
    recorded; with no history it is ``initial``. Each window is a
    ``deque(maxlen=window)``; per-prompt mode keeps one per prompt seen, up
    to ``max_prompts`` (the least recently seen is forgotten first).

    A per-prompt window is a baseline only where prompts come back: on a
    stream of fresh tasks (a generated env, one epoch of a large dataset) every
    window is empty, the baseline stays ``initial`` and the advantage is the
    raw reward. :meth:`metrics` shows it: ``baseline/with_history`` is the
    share of the last batch whose window had any reward in it.

    Prompt ids must be hashable; use ``str`` or ``int`` ids for
    :meth:`state_dict` to survive a JSON round trip unchanged.
    """

    def __init__(self, window: int = 8, *, per_prompt: bool = True, initial: float = 0.0,
                 max_prompts: int = 100_000):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        if max_prompts < 1:
            raise ValueError(f"max_prompts must be >= 1, got {max_prompts}")
        self.window = window
        self.per_prompt = per_prompt
        self.initial = float(initial)
        self.max_prompts = max_prompts
        self._history: OrderedDict[Hashable, deque[float]] = OrderedDict()
        self._last: list[tuple[float, bool]] = []  # (baseline, had history) of the last batch

    def _key(self, prompt_id: Hashable) -> Hashable:
        return prompt_id if self.per_prompt else None

    def baseline(self, prompt_id: Hashable) -> float:
        """The current baseline for ``prompt_id`` without recording anything."""
        history = self._history.get(self._key(prompt_id))
        return math.fsum(history) / len(history) if history else self.initial

    def advantage(self, prompt_id: Hashable, reward: float) -> float:
        """Return ``reward - baseline(prompt_id)``, then record ``reward``."""
        baseline = self.baseline(prompt_id)
        key = self._key(prompt_id)
        had = key in self._history
        if had:
            self._history.move_to_end(key)
        else:
            self._history[key] = deque(maxlen=self.window)
            if len(self._history) > self.max_prompts:
                self._history.popitem(last=False)
        self._history[key].append(float(reward))
        self._last.append((baseline, had))
        return float(reward) - baseline

    def advantages(self, prompt_ids: Iterable[Hashable], rewards: Iterable[float]) -> list[float]:
        """:meth:`advantage` over a batch, in order.

        A later rollout of the batch sees the rewards of the earlier ones.
        """
        prompt_ids, rewards = list(prompt_ids), list(rewards)
        if len(prompt_ids) != len(rewards):
            raise ValueError(f"{len(prompt_ids)} prompt ids but {len(rewards)} rewards")
        self._last = []
        return [self.advantage(p, r) for p, r in zip(prompt_ids, rewards, strict=True)]

    def metrics(self) -> dict[str, float]:
        """The last :meth:`advantages` batch's baseline, as step metrics.

        ``baseline/mean``: the mean baseline subtracted; ``baseline/with_history``:
        the share of rollouts whose window held a reward (0: ``initial`` for all).
        """
        if not self._last:
            return {}
        n = len(self._last)
        return {"baseline/mean": math.fsum(b for b, _ in self._last) / n,
                "baseline/with_history": sum(h for _, h in self._last) / n}

    def state_dict(self) -> dict[str, Any]:
        """Config and history as plain JSON-able data (history as ``[id, rewards]`` pairs)."""
        return {
            "window": self.window,
            "per_prompt": self.per_prompt,
            "initial": self.initial,
            "history": [[key, list(rewards)] for key, rewards in self._history.items()],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the history saved by :meth:`state_dict`.

        ``per_prompt`` must match. ``window`` and ``initial`` stay this
        object's own: a longer saved history keeps its last ``window`` rewards.
        """
        if bool(state["per_prompt"]) != self.per_prompt:
            raise ValueError(
                f"state has per_prompt={state['per_prompt']}, this baseline {self.per_prompt}"
            )
        self._history = OrderedDict()
        for key, rewards in state["history"][-self.max_prompts:]:
            key = tuple(key) if isinstance(key, list) else key
            self._history[key] = deque((float(r) for r in rewards), maxlen=self.window)


def explained_variance(values_BT: Tensor, returns_BT: Tensor, mask_BT: Tensor) -> float:
    """Critic diagnostic ``1 - Var(R - V) / Var(R)`` over action tokens.

    Population variances, computed in float64. 1 is a perfect critic, 0 is
    no better than predicting the mean return, negative is worse. Returns
    ``nan`` when ``Var(R) == 0`` or there is no action token (undefined; as
    cleanrl does, and 0 would falsely read as "as good as the mean").
    """
    mask = mask_BT.bool()
    returns = returns_BT.detach()[mask].to(torch.float64)
    values = values_BT.detach()[mask].to(torch.float64)
    if returns.numel() == 0:
        return math.nan
    var_returns = returns.var(unbiased=False)
    if var_returns == 0:
        return math.nan
    return float(1.0 - (returns - values).var(unbiased=False) / var_returns)
