"""A warm start's label smoothing fitted to the length of the env's episodes."""

import pytest

from sao_gym.runtime.plans import Budgets
from sao_gym.runtime.prepare.fit import SAMPLED_SUCCESS, fit_label_smoothing
from sao_gym.types import Rollout, StopReason


def rollout(action_tokens: int, reward: float = 1.0) -> Rollout:
    mask = [0] * 5 + [1] * action_tokens
    return Rollout(token_ids=list(range(len(mask))), loss_mask=mask,
                   rollout_logprobs=[0.0] * len(mask), policy_versions=[-1] * len(mask),
                   reward=reward, terminated=True, truncated=False,
                   stop_reason=StopReason.TERMINATED, infra_failure=False, messages=[],
                   env_id="e", task_id="t", seed=0)


def budgets(label_smoothing: float | None) -> Budgets:
    return Budgets(max_new_tokens=32, max_context_tokens=512, label_smoothing=label_smoothing)


def test_null_label_smoothing_leaves_a_perfect_imitator_the_target_sampled_success():
    for n in (4, 18, 80):
        fitted, lines = fit_label_smoothing(budgets(None),
                                            [rollout(n), rollout(n)])
        eps = fitted.label_smoothing
        assert (1 - eps) ** n == pytest.approx(SAMPLED_SUCCESS, rel=1e-3)
        assert len(lines) == 1 and f"label_smoothing = {eps}" in lines[0]
    # hand value: 18 tokens -> 1 - 0.15 ** (1 / 18)
    fitted, _ = fit_label_smoothing(budgets(None), [rollout(18)])
    assert fitted.label_smoothing == pytest.approx(0.1001, abs=1e-4)


def test_the_mean_length_of_rewarded_demonstrations_counts():
    demos = [rollout(10), rollout(30), rollout(500, reward=0.0)]
    fitted, _ = fit_label_smoothing(budgets(None), demos)
    assert fitted.label_smoothing == pytest.approx(1 - SAMPLED_SUCCESS ** (1 / 20),
                                                              abs=1e-4)


def test_a_set_value_no_warm_start_or_no_demonstrations_change_nothing():
    for given, demos in ((budgets(0.05), [rollout(9)]), (budgets(None), []),
                         (budgets(0.0), [rollout(9)])):  # 0.0: a run without a warm start
        assert fit_label_smoothing(given, demos) == (given, [])
