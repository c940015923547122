"""Which recipe `sao-gym train` runs without a config file, and how the generic CPU recipe
and the embedded demo relate."""

from __future__ import annotations

import pytest
import yaml

from sao_gym.cli.train import default_recipe
from sao_gym.runtime.config.loader import load_recipe, recipe_path

DEMO_CHOICES = {"env", "env_kwargs", "rollout.max_new_tokens", "rollout.max_context_tokens",
                "rollout.max_episode_steps"}
"""What demo.yaml chooses for its env, where cpu.yaml leaves the env's values."""
DEMO_WARM_START = {"warm_start.lr": (1.0e-3, 3.0e-3), "warm_start.label_smoothing": (None, 0.1),
                   "warm_start.min_sampled_success": (0.075, None),
                   "model_options.head_dim": (32, 64),
                   "model_options.tie_embeddings": (False, True)}
"""(cpu, demo) values of the warm start the demo keeps as measured (docs/benchmarks.md) while
the generic recipe moved on: lr 1e-3 ("3e-3 (the demo's) never learned to copy a word from an
observation", cpu.yaml), label smoothing fitted to the episodes' length, a floor on the
sampled success at the stop, 4 heads, and an LM head untied from the embeddings."""


@pytest.mark.parametrize("overrides, recipe", [
    ([], "demo"),
    (["env=sao_gym/HeavyTail-v0"], "cpu"),
    (["total_steps=3", "env=my_envs:my/Env-v0", "seed=1"], "cpu"),
    ([" env = sao_gym/HeavyTail-v0"], "cpu"),
    (["rollout.env=sao_gym/HeavyTail-v0"], "demo"),
    (["env_kwargs={operators: '-'}"], "demo"),
    (["environment=sao_gym/HeavyTail-v0"], "demo"),
    (["warm_start.env=x", "total_steps=3"], "demo"),
    (["model=tiny", "rollout.max_new_tokens=env"], "demo"),
])
def test_the_default_recipe_is_cpu_only_when_an_env_is_named(overrides, recipe):
    assert default_recipe(overrides) == recipe


def test_the_cpu_recipe_leaves_the_env_its_own_limits():
    config = load_recipe("cpu", ["env=sao_gym/HeavyTail-v0"])
    assert config.env == "sao_gym/HeavyTail-v0" and config.env_kwargs == {}
    r = config.rollout
    assert (r.max_episode_steps, r.max_new_tokens, r.max_context_tokens) == (None, None, None)
    assert config.model == "tiny" and config.warm_start is not None
    assert load_recipe("cpu").env is None  # it names no env of its own


def test_the_demo_recipe_names_its_env_and_budgets():
    demo = load_recipe("demo")
    assert demo.env == "sao_gym/Arithmetic-v0" and demo.env_kwargs == {"operators": "+"}
    r = demo.rollout
    assert (r.max_episode_steps, r.max_new_tokens, r.max_context_tokens) == (4, 24, 512)


def flat(data: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flat(value, name + "."))
        else:
            out[name] = value
    return out


def is_demo_choice(key: str) -> bool:
    return any(key == c or key.startswith(c + ".") for c in DEMO_CHOICES)


def test_the_demo_repeats_the_cpu_recipe_but_for_its_env_choices():
    cpu = flat(yaml.safe_load(recipe_path("cpu").read_text()))
    demo = flat(yaml.safe_load(recipe_path("demo").read_text()))
    assert len(cpu) > 30  # not a vacuous comparison
    differ = {k: (cpu[k], demo[k]) for k in cpu.keys() & demo.keys()
              if not is_demo_choice(k) and cpu[k] != demo[k]}
    assert differ == DEMO_WARM_START
    assert sorted(k for k in cpu.keys() - demo.keys()) == []  # the demo repeats every key
    assert all(is_demo_choice(k) for k in demo.keys() - cpu.keys()), demo.keys() - cpu.keys()
    # the choices are the demo's own: the cpu recipe leaves them to the env
    assert {k: cpu.get(k) for k in DEMO_CHOICES if k != "env_kwargs"} == {
        "env": None, "rollout.max_new_tokens": None, "rollout.max_context_tokens": None,
        "rollout.max_episode_steps": None}
    assert demo["env"] == "sao_gym/Arithmetic-v0" and demo["env_kwargs.operators"] == "+"
