"""Fitting a run's null token budgets to demonstrations of its env (sao_gym.runtime.prepare.fit)."""

from __future__ import annotations

import math

import pytest

from sao_gym.runtime.plans import Budgets
from sao_gym.runtime.prepare.fit import (
    FALLBACK_CONTEXT_TOKENS,
    FALLBACK_NEW_TOKENS,
    EpisodeShape,
    fit_budgets,
)
from sao_gym.types import Rollout, StopReason


def rollout(mask: list[int]) -> Rollout:
    n = len(mask)
    return Rollout(token_ids=list(range(100, 100 + n)), loss_mask=list(mask),
                   rollout_logprobs=[0.0] * n, policy_versions=[0 if m else -1 for m in mask],
                   reward=1.0, terminated=True, truncated=False,
                   stop_reason=StopReason.TERMINATED, infra_failure=False, messages=[],
                   env_id="tests/Fit-v0", task_id="t", seed=0)


def episode(prompt: int, *turns: tuple[int, int]) -> Rollout:
    """A prompt, then (turn tokens, observation tokens after it) per turn."""
    mask = [0] * prompt
    for turn, obs in turns:
        mask += [1] * turn + [0] * obs
    return rollout(mask)


def null_budgets(new: int | None = None, context: int | None = None) -> Budgets:
    return Budgets(max_new_tokens=new, max_context_tokens=context)


# ----- EpisodeShape ---------------------------------------------------------------------------

def test_shape_of_one_rollout():
    shape = EpisodeShape.of([rollout([0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0])])
    assert shape == EpisodeShape(prompt_tokens=3, turn_tokens=3, observation_tokens=2, turns=2)


def test_shape_is_the_max_over_rollouts_field_by_field():
    a = rollout([0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0])          # prompt 3, turns 2 and 3, obs 2
    b = rollout([0] * 5 + [1] * 4)                         # prompt 5, one turn of 4
    c = rollout([0, 1, 0, 0, 0, 0, 1, 0, 1, 0, 1])         # obs 4, four turns of 1
    assert EpisodeShape.of([a, b, c]) == EpisodeShape(5, 4, 4, 4)
    assert EpisodeShape.of([c, b, a]) == EpisodeShape(5, 4, 4, 4)  # order does not matter


def test_shape_of_a_rollout_that_opens_with_an_action():
    assert EpisodeShape.of([rollout([1, 1, 0, 1])]) == EpisodeShape(0, 2, 1, 2)
    # another rollout's prompt still counts
    assert EpisodeShape.of([rollout([1, 1, 0, 1]), rollout([0, 0, 1])]) == \
        EpisodeShape(2, 2, 1, 2)


def test_shape_of_built_episodes():
    assert EpisodeShape.of([episode(30, (7, 12), (5, 3))]) == EpisodeShape(30, 7, 12, 2)


# ----- fit_budgets ----------------------------------------------------------------------------

DEMOS = [episode(30, (7, 12), (5, 3)), episode(21, (6, 9))]  # prompt 30, turn 7, obs 12, 2 turns


def test_both_budgets_fitted_to_the_demonstrations():
    given = null_budgets()
    fitted, lines = fit_budgets(given, DEMOS, turn_limit=4)
    new = max(8, 2 * 7)                                  # 14
    context = 64 * math.ceil((30 + 4 * (14 + 12)) / 64)  # 134 -> 192
    assert (new, context) == (14, 192)
    assert fitted.max_new_tokens == new
    assert fitted.max_context_tokens == context
    assert lines == [
        "rollout.max_new_tokens = 14 (twice the longest demonstrated turn, 7 tokens)",
        "rollout.max_context_tokens = 192 (the longest prompt, 30 tokens, plus 4 turns of "
        "14 + 12 observation tokens)",
    ]
    # nothing else changes, and the given record is left as it was
    assert fitted.label_smoothing == given.label_smoothing == 0.0
    assert given.max_new_tokens is None and given.max_context_tokens is None


def test_a_short_turn_gets_the_minimum_turn_budget():
    fitted, _ = fit_budgets(null_budgets(), [episode(10, (3, 2))], turn_limit=2)
    assert fitted.max_new_tokens == 8  # max(8, 2 * 3)
    assert fitted.max_context_tokens == 64  # 64 * ceil((10 + 2 * (8 + 2)) / 64)


def test_a_context_that_is_a_multiple_of_64_is_not_rounded_up():
    # prompt 4, turn 10 -> new 20, obs 10: 4 + 2 * 30 = 64
    fitted, _ = fit_budgets(null_budgets(), [episode(4, (10, 10))], turn_limit=2)
    assert (fitted.max_new_tokens, fitted.max_context_tokens) == (20, 64)


@pytest.mark.parametrize("positions, context", [(128, 128), (192, 192), (1000, 192),
                                                (None, 192)])
def test_the_context_is_capped_at_the_model_positions(positions, context):
    fitted, lines = fit_budgets(null_budgets(), DEMOS, turn_limit=4, model_positions=positions)
    assert fitted.max_context_tokens == context
    assert fitted.max_new_tokens == 14  # the turn budget is not capped
    capped = "; capped at the model's 128)"
    assert lines[1].endswith(capped) == (context == 128)
    assert lines[1].startswith(f"rollout.max_context_tokens = {context} (")


def test_without_a_turn_limit_twice_the_demonstrated_turns_at_least_16():
    fitted, lines = fit_budgets(null_budgets(), DEMOS, turn_limit=None)
    # max(16, 2 * 2) = 16 turns: 30 + 16 * (14 + 12) = 446 -> 448
    assert fitted.max_context_tokens == 448
    assert "plus 16 turns of 14 + 12 observation tokens (no turn limit registered" in lines[1]
    many = [episode(2, *[(1, 1)] * 10)]  # 10 turns: 20 turns of 8 + 1, plus 2 -> 182 -> 192
    fitted, lines = fit_budgets(null_budgets(), many, turn_limit=None)
    assert (fitted.max_new_tokens, fitted.max_context_tokens) == (8, 192)
    assert "plus 20 turns of 8 + 1 observation tokens" in lines[1]


def test_values_the_config_sets_are_kept():
    both = Budgets(max_new_tokens=40, max_context_tokens=300)
    fitted, lines = fit_budgets(both, DEMOS, turn_limit=4, model_positions=128)
    assert (fitted.max_new_tokens, fitted.max_context_tokens) == (40, 300)
    assert lines == []
    # a set turn budget is what the fitted context makes room for
    new_set = null_budgets(new=40)
    fitted, lines = fit_budgets(new_set, DEMOS, turn_limit=4)
    assert fitted.max_new_tokens == 40
    assert fitted.max_context_tokens == 256  # 30 + 4 * (40 + 12) = 238 -> 256
    assert len(lines) == 1 and lines[0].startswith("rollout.max_context_tokens = 256 (")
    context_set = null_budgets(context=100)
    fitted, lines = fit_budgets(context_set, DEMOS, turn_limit=4)
    assert (fitted.max_new_tokens, fitted.max_context_tokens) == (14, 100)
    assert len(lines) == 1 and lines[0].startswith("rollout.max_new_tokens = 14 (")


@pytest.mark.parametrize("demos", [None, []])
def test_without_demonstrations_the_fallbacks_apply(demos):
    fitted, lines = fit_budgets(null_budgets(), demos, turn_limit=4)
    assert (FALLBACK_NEW_TOKENS, FALLBACK_CONTEXT_TOKENS) == (256, 2048)
    assert (fitted.max_new_tokens, fitted.max_context_tokens) == (256, 2048)
    assert len(lines) == 2
    assert lines[0].startswith("rollout.max_new_tokens = 256 (no demonstrations to fit to")
    assert lines[1].startswith("rollout.max_context_tokens = 2048 (no demonstrations to fit to")
    # the fallback context is capped like a fitted one
    fitted, lines = fit_budgets(null_budgets(), demos, turn_limit=4, model_positions=1024)
    assert fitted.max_context_tokens == 1024
    assert lines[1].endswith("; capped at the model's 1024)")
