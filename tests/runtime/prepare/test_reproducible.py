"""The same recipe, env and seed give the same warm start: bit-identical, stopped at the same step.

Everything a new run's start is made of is rebuilt each time (the tiny model's
tokenizer trained on the env's text, its random weights, the oracle's
demonstrations, the fitted budgets, the supervised steps and their held-out
checks), so a study's rows started from "seed s" are started from the same
checkpoint whenever it is made.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sao_gym.learner import sft as sft_module
from sao_gym.runtime.config.build import train_plan
from sao_gym.runtime.config.loader import load_config
from sao_gym.runtime.prepare import start

RECIPE = ["env=sao_gym/Arithmetic-v0", "model=tiny",
          "model_options={hidden_size: 64, num_layers: 1}",
          # a sampled held-out target this small model reaches at a check within the steps
          "warm_start={steps: 150, episodes: 48, holdout_episodes: 16, batch_size: 4, "
          "lr: 3.0e-3, target_success: 1.0e-5, target_metric: sampled}"]


class Interrupted(Exception):
    """Stands for the process dying."""


def _plan(seed: int):
    return train_plan(load_config(None, [*RECIPE, f"seed={seed}"])).prepare


def _start(run: Path, seed: int) -> start.Start:
    return start.prepare(_plan(seed), run)


def _killed_at_its_stop_then_resumed(run: Path, seed: int, monkeypatch) -> start.Start:
    """The process dies right after the early stop's state is saved; ``--resume``."""
    real = sft_module.sft

    def dying(*args, callback, **kw):
        def report(s):
            callback(s)
            if s.reached:
                raise Interrupted
        return real(*args, callback=report, **kw)

    monkeypatch.setattr(sft_module, "sft", dying)
    with pytest.raises(Interrupted):
        start.prepare(_plan(seed), run)
    monkeypatch.setattr(sft_module, "sft", real)
    return start.resume(_plan(seed), run, has_checkpoint=False)


def _files(checkpoint: str) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(Path(checkpoint).iterdir()) if p.is_file()}


@pytest.mark.slow
def test_two_warm_starts_of_one_recipe_env_and_seed_are_bit_identical(tmp_path, monkeypatch):
    a = _start(tmp_path / "a", 1)
    # the other is killed at its early stop and resumed: its record too is the same
    b = _killed_at_its_stop_then_resumed(tmp_path / "b", 1, monkeypatch)
    files_a, files_b = _files(a.policy), _files(b.policy)
    assert files_a.keys() == files_b.keys() >= {"model.safetensors", "tokenizer.json",
                                                 start.WARM_RECORD}
    for name in files_a:
        assert files_a[name] == files_b[name], name
    record = json.loads(files_a[start.WARM_RECORD])
    # the record says where it stopped and why; it stopped at a held-out check
    assert record["reached_target"] and record["stopped_at_step"] < record["max_steps"]
    assert record["last_check"]["step"] == record["stopped_at_step"]
    assert record["last_check"]["sampled"] >= 1e-5
    assert record["demonstrations"] == 48 and record["holdout_demonstrations"] > 0
    # another seed is another start
    c = _start(tmp_path / "c", 2)
    assert _files(c.policy)["model.safetensors"] != files_a["model.safetensors"]
