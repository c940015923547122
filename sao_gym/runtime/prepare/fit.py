"""Fitting a run's token budgets to its environment.

A recipe that trains any environment cannot know how long the env's turns,
observations and prompts are. Where the config leaves ``rollout.max_new_tokens``
or ``rollout.max_context_tokens`` null (None in the run's
:class:`~sao_gym.runtime.plans.Budgets`), :func:`fit_budgets` derives them from
demonstrations of the env (token-exact rollouts, so counted with the run's own
tokenizer and chat template):

- ``max_new_tokens``: twice the longest demonstrated turn (its end-of-turn
  token included), at least :data:`MIN_NEW_TOKENS`: room for a policy that
  writes a little more than its teacher, while a policy that rambles is cut
  off early (on a small model, sampled junk until the budget is most of the
  cost of a bad turn);
- ``max_context_tokens``: room for the longest prompt plus the turn limit's
  worth of turns of ``max_new_tokens`` each, each answered by an observation
  as long as the longest demonstrated one; rounded up to a multiple of 64
  and capped at the model's positions.

Without demonstrations the fallbacks :data:`FALLBACK_NEW_TOKENS` and
:data:`FALLBACK_CONTEXT_TOKENS` apply.

:func:`fit_label_smoothing` fits a warm start's ``label_smoothing`` left
null: a policy that matches smoothed targets exactly samples each token it
was shown with probability about ``1 - eps``, so a whole demonstrated
episode of ``n`` action tokens with ``(1 - eps) ** n``. The fitted ``eps``
makes that :data:`SAMPLED_SUCCESS` for the demonstrations' mean ``n``: a warm
start that knows the task (greedy decoding solves it) while sampling at
temperature 1 still errs, about as often on a 3-turn env as on a 30-turn one.
A fixed ``eps`` does not transfer: 0.1 leaves 15% on an 18-token episode and
0.02% on an 80-token one, where RL never sees a reward. Each decision comes back as one
line of text saying which value applies and why, for the run's output. Both
return a new :class:`~sao_gym.runtime.plans.Budgets` record, which the job puts
into its plan (:meth:`~sao_gym.runtime.plans.TrainPlan.fitted`) and saves with
the run's config, so evaluation and resume use the same values.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from sao_gym.runtime.plans import Budgets
from sao_gym.types import Rollout

MIN_NEW_TOKENS = 8
"""Smallest fitted turn budget."""
FALLBACK_NEW_TOKENS = 256
"""Turn budget when there are no demonstrations to fit to."""
FALLBACK_CONTEXT_TOKENS = 2048
"""Context budget when there are no demonstrations to fit to."""
SAMPLED_SUCCESS = 0.15
"""What a fitted label smoothing leaves a perfect imitator's sampled episodes."""
FALLBACK_TURNS = 16
"""Turns assumed for the context when the env registers no turn limit (times the
longest demonstration's turns, at least this)."""


@dataclasses.dataclass(frozen=True)
class EpisodeShape:
    """Token counts of demonstrations: what the budgets are fitted to."""

    prompt_tokens: int
    """Longest prompt (tokens before the first action token)."""
    turn_tokens: int
    """Longest assistant turn (end-of-turn token included)."""
    observation_tokens: int
    """Longest observation (tokens between two turns)."""
    turns: int
    """Most turns in one demonstration."""

    @classmethod
    def of(cls, rollouts: Sequence[Rollout]) -> EpisodeShape:
        """The shape of ``rollouts`` (at least one, each with an action token)."""
        prompt = turn = obs = turns = 0
        for r in rollouts:
            runs = _runs(r.loss_mask)
            if not runs or runs[0][0] != 1:
                prompt = max(prompt, runs[0][1] if runs else 0)
            acting = [n for bit, n in runs if bit == 1]
            between = [n for bit, n in runs[1:] if bit == 0]
            turn = max([turn, *acting])
            obs = max([obs, *between])
            turns = max(turns, len(acting))
        return cls(prompt, turn, obs, turns)


def _runs(mask: Sequence[int]) -> list[tuple[int, int]]:
    """``[(bit, length), ...]`` of the runs of equal values in ``mask``."""
    runs: list[tuple[int, int]] = []
    for bit in mask:
        if runs and runs[-1][0] == bit:
            runs[-1] = (bit, runs[-1][1] + 1)
        else:
            runs.append((bit, 1))
    return runs


def fit_budgets(budgets: Budgets, demonstrations: Sequence[Rollout] | None, *,
                turn_limit: int | None, model_positions: int | None = None
                ) -> tuple[Budgets, list[str]]:
    """``budgets`` with its null token budgets fitted, and one line per fitted value.

    ``turn_limit``: the episode's turn limit (the run's ``max_episode_steps`` or
    the env's registered one; None: none). ``model_positions``: the model's
    maximum sequence length (caps the context). Values already set are kept.
    """
    lines: list[str] = []
    new, context = budgets.max_new_tokens, budgets.max_context_tokens
    shape = EpisodeShape.of(demonstrations) if demonstrations else None
    if new is None:
        if shape is None:
            new = FALLBACK_NEW_TOKENS
            lines.append(f"rollout.max_new_tokens = {new} (no demonstrations to fit to; "
                         "set rollout.max_new_tokens to change it)")
        else:
            new = max(MIN_NEW_TOKENS, 2 * shape.turn_tokens)
            lines.append(f"rollout.max_new_tokens = {new} (twice the longest demonstrated "
                         f"turn, {shape.turn_tokens} tokens)")
    if context is None:
        if shape is None:
            context = FALLBACK_CONTEXT_TOKENS
            why = "no demonstrations to fit to; set rollout.max_context_tokens to change it"
        else:
            turns = turn_limit or max(FALLBACK_TURNS, 2 * shape.turns)
            context = 64 * math.ceil(
                (shape.prompt_tokens + turns * (new + shape.observation_tokens)) / 64)
            why = (f"the longest prompt, {shape.prompt_tokens} tokens, plus {turns} turns of "
                   f"{new} + {shape.observation_tokens} observation tokens"
                   + ("" if turn_limit else " (no turn limit registered: twice the "
                      "demonstrations' turns, at least 16)"))
        if model_positions is not None and context > model_positions:
            context, why = model_positions, why + f"; capped at the model's {model_positions}"
        lines.append(f"rollout.max_context_tokens = {context} ({why})")
    return dataclasses.replace(budgets, max_new_tokens=new, max_context_tokens=context), lines


def fit_label_smoothing(budgets: Budgets, demonstrations: Sequence[Rollout]
                        ) -> tuple[Budgets, list[str]]:
    """``budgets`` with a null ``label_smoothing`` fitted (see the module docs).

    Unchanged (and no line) when it is set or there are no demonstrations.
    """
    if budgets.label_smoothing is not None or not demonstrations:
        return budgets, []
    rewarded = [r for r in demonstrations if r.reward > 0] or list(demonstrations)
    n = sum(r.num_action_tokens for r in rewarded) / len(rewarded)
    eps = round(1.0 - SAMPLED_SUCCESS ** (1.0 / max(n, 1.0)), 6)
    line = (f"warm_start.label_smoothing = {eps} (a perfect imitator would sample the "
            f"demonstrated {n:.0f} action tokens of an episode with probability "
            f"{SAMPLED_SUCCESS}: headroom for RL)")
    return dataclasses.replace(budgets, label_smoothing=eps), [line]


__all__ = ["EpisodeShape", "fit_budgets", "fit_label_smoothing"]
