"""The environment of benchmarks/vs_trl.py: rewards, splits, the checker (no TRL, no training)."""

from __future__ import annotations

import pytest

import sao_gym
from sao_gym.utils.env_checker import check_agent_env
from tests.helpers import import_benchmark


@pytest.fixture(scope="module")
def vs_trl():
    return import_benchmark("vs_trl")


@pytest.fixture(scope="module")
def arith(vs_trl):
    return import_benchmark("vs_trl_task")  # imported by vs_trl already


def _reward(vs_trl, prompt: str, text: str, task: dict) -> tuple[float, bool]:
    env = sao_gym.make(vs_trl.QUALIFIED_ENV_ID)
    obs, _ = env.reset(seed=0, options={"task": task})
    assert obs == [{"role": "user", "content": prompt.format(**task)}]
    _, reward, terminated, truncated, _ = env.step(text)
    env.close()
    return reward, terminated and not truncated


def test_importing_registers_the_env(vs_trl):
    assert vs_trl.ENV_ID in sao_gym.env_ids()


@pytest.mark.parametrize(("text", "expected"), [
    ("<answer>-4</answer>", 1.0),
    ("The answer is <answer> -4 </answer>.", 1.0),
    ("<answer>5</answer>", 0.1),
    ("<answer>minus four</answer>", 0.1),
    ("<answer></answer>", 0.1),
    ("-4", 0.0),
    ("<answer>-4", 0.0),
    ("", 0.0),
])
def test_rewards(vs_trl, arith, text, expected):
    reward, ended = _reward(vs_trl, arith.PROMPT, text, {"a": 3, "op": "-", "b": 7})
    assert reward == expected
    assert ended  # single turn: the first reply ends the episode


def test_first_answer_counts(arith):
    assert arith.score("<answer>1</answer><answer>10</answer>", "10") == 0.1
    assert arith.score("<answer>10</answer><answer>1</answer>", "10") == 1.0


def test_splits_are_disjoint_and_fixed(arith):
    train, heldout = arith.split_tasks("train"), arith.split_tasks("heldout")
    assert (len(train), len(heldout)) == (600, 200)
    ids = {t["id"] for t in train} | {t["id"] for t in heldout}
    assert len(ids) == 800
    assert [t["id"] for t in heldout] == [t["id"] for t in arith.split_tasks("heldout")]
    with pytest.raises(ValueError, match="split must be one of"):
        arith.split_tasks("test")


@pytest.mark.parametrize("split", ["train", "heldout"])
def test_reset_draws_from_its_split(vs_trl, arith, split):
    allowed = {t["id"] for t in arith.split_tasks(split)}
    env = sao_gym.make(vs_trl.ENV_ID, split=split)
    drawn = set()
    for seed in range(100):
        env.reset(seed=seed)
        task = env.unwrapped.task
        assert task["id"] in allowed
        assert task["answer"] == str(task["a"] + task["b"] if task["op"] == "+"
                                     else task["a"] - task["b"])
        drawn.add(task["id"])
    env.close()
    assert len(drawn) > 50


def test_passes_the_checker(vs_trl):
    assert len(check_agent_env(sao_gym.make(vs_trl.QUALIFIED_ENV_ID))) == 7


def _side(**extra):
    return {"lr": 5e-5, "steps": 10, "wall_s": 60.0, "completions_per_s": 10.0,
            "tokens_per_s": 100.0, "peak_rss_mb": 1000.0, "accuracy_before": 0.25,
            "accuracy_after": 0.2, "gain_points": -5.0, **extra}


def test_the_report_shows_trained_problems_and_the_sao_step_split(vs_trl):
    targets = {"gain_difference_points": 1.0, "gain_met": False, "throughput_ratio": 0.5,
               "throughput_met": False}
    trl = _side(trained_accuracy_before=0.9, trained_accuracy_after=0.95)
    sao = _side(trained_accuracy_before=0.9, trained_accuracy_after=0.99,
                step_times_median_s={"step_time_s": 2.5, "policy_time_s": 0.8,
                                     "critic_time_s": 1.4})
    text = vs_trl.table(trl, sao, targets, [])
    assert "| greedy accuracy on 200 trained problems | 90.0% -> 95.0% | 90.0% -> 99.0% |" in text
    assert "total / policy / critic (s) | | 2.50 / 0.80 / 1.40 |" in text
    old = vs_trl.table(_side(), _side(), targets, [])  # results kept from before these rows
    assert "trained problems" not in old and "critic (s)" not in old
