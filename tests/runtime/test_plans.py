"""The builder's plans (sao_gym.runtime.plans): what they hold, and fitted budgets put in."""

from __future__ import annotations

import pytest

from sao_gym.runtime.config.build import eval_plan, train_plan
from sao_gym.runtime.config.loader import load_config, load_recipe
from sao_gym.runtime.plans import EVAL_SEED, Budgets


def test_a_plan_holds_what_the_config_says():
    config = load_recipe("demo", ["seed=3", "warm_start.steps=40", "warm_start.lr=0.02",
                                  "warm_start.label_smoothing=0.1", "eval.temperature=0.5",
                                  "rollout.max_episode_steps=6"])
    plan = train_plan(config)
    prep = plan.prepare
    assert (prep.model.name, prep.model.seed, prep.model.chat_template) == (
        config.model, 3, config.chat_template)
    assert prep.turn_limit == 6 and prep.seed == 3
    assert prep.demonstrations.oracle is not None and prep.demonstrations.conversations is None
    assert prep.demonstrations.episodes == config.warm_start.episodes
    s = prep.sft
    assert (s.steps, s.lr, s.seed, s.warmup_steps, s.label_smoothing) == (40, 0.02, 3, 2, 0.1)
    assert plan.eval.temperature == 0.5 and plan.eval.seed == EVAL_SEED
    assert plan.eval.episodes == config.eval.episodes
    assert plan.parts.rollouts.agent.temperature == config.rollout.temperature
    assert plan.place == "sao_gym.runtime.place.local:local_trainer" and plan.restarts == 0
    assert plan.record == config.to_dict()
    assert plan.title.startswith(f"{config.algorithm} (async) on {config.env}")
    ray = train_plan(load_recipe("demo", ["runtime=ray", "ray.max_learner_restarts=5"]))
    assert ray.place.endswith(":ray_trainer") and ray.restarts == 5


def test_without_an_oracle_or_a_file_there_is_no_warm_start_and_the_plan_says_why():
    plan = train_plan(load_config(None, ["env=sao_gym/HeavyTail-v0", "warm_start.steps=10"]))
    assert plan.prepare.demonstrations is None and plan.prepare.sft is None
    assert "registers no oracle" in plan.prepare.no_warm_start
    plan = train_plan(load_config(None, ["env=sao_gym/Arithmetic-v0", "warm_start=null"]))
    assert plan.prepare.no_warm_start == "no warm start (warm_start: null)"
    assert plan.prepare.budgets.label_smoothing == 0.0  # nothing to fit without one


def test_fitted_budgets_reach_every_record_that_uses_them():
    config = load_config(None, ["env=sao_gym/Arithmetic-v0", "warm_start.steps=10",
                                "warm_start.label_smoothing=null", "rollout.max_new_tokens=null",
                                "rollout.max_context_tokens=null"])
    plan = train_plan(config)
    assert plan.prepare.budgets == Budgets(None, None, None)
    assert not plan.prepare.budgets.complete
    with pytest.raises(ValueError, match="null"):  # agents cannot be built unfitted
        plan.parts.rollouts.agent.check()
    with pytest.raises(ValueError, match="not all fitted"):
        plan.fitted(Budgets(32, None, 0.1))
    fitted = plan.fitted(Budgets(32, 640, 0.07))
    for rollouts in (fitted.parts.rollouts, fitted.eval.rollouts):
        assert (rollouts.agent.max_new_tokens, rollouts.agent.max_context_tokens) == (32, 640)
    assert fitted.prepare.budgets == Budgets(32, 640, 0.07)
    assert fitted.prepare.sft.label_smoothing == 0.07
    assert fitted.record["rollout"]["max_new_tokens"] == 32
    assert fitted.record["warm_start"]["label_smoothing"] == 0.07
    assert fitted.parts.sink.record == fitted.record  # the loggers record the fitted config
    assert plan.record["rollout"]["max_new_tokens"] is None  # the plan itself is unchanged
    assert fitted.eval.report()["max_context_tokens"] == 640


@pytest.mark.parametrize("backend, limit, expected", [
    ("vllm_server", None, 640),   # null: the server serves the agent's context
    ("vllm_server", 4096, 4096),  # set: kept
    ("hf", None, None),           # a section without the key is left alone
])
def test_a_null_context_limit_follows_the_agents_context(backend, limit, expected):
    sets = ["env=sao_gym/Arithmetic-v0", f"inference.backend={backend}",
            "rollout.max_context_tokens=640"]
    if backend == "vllm_server":
        sets += ["inference.launch=1",
                 f"inference.max_model_len={'null' if limit is None else limit}"]
    rollouts = train_plan(load_config(None, sets)).parts.rollouts
    assert getattr(rollouts.backend, "max_model_len", None) == expected
    again = rollouts.with_budgets(16, 320)  # filled once: a limit, once set, stays
    assert again.agent.max_context_tokens == 320
    if expected is not None:
        assert again.backend.max_model_len == (4096 if limit else 640)


def test_an_eval_plan_takes_its_episodes_and_seed():
    config = load_config(None, ["env=sao_gym/Arithmetic-v0", "eval.episodes=7",
                                "rollout.max_new_tokens=8", "rollout.max_context_tokens=256"])
    assert eval_plan(config).episodes == 7
    plan = eval_plan(config, episodes=3, seed=5)
    assert (plan.episodes, plan.seed, plan.env_id) == (3, 5, "sao_gym/Arithmetic-v0")
    report = plan.report()
    assert report["env"] == "sao_gym/Arithmetic-v0" and report["max_new_tokens"] == 8
    assert report["max_episode_steps"] == 8  # the env's registered limit
