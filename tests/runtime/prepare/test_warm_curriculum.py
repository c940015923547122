"""A warm start climbs the curriculum: level by level, each until its held-out check passes.

The held-out estimate is replaced by one that says which levels pass (the
supervised steps, demonstrations and checkpoints are real), so where each
stage stops is known in advance.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from sao_gym.learner import sft as sft_module
from sao_gym.runtime.config.build import train_plan
from sao_gym.runtime.config.loader import load_config
from sao_gym.runtime.prepare import start

RECIPE = ["env=sao_gym/KeyChain-v0", "env_kwargs={hops: 16}", "model=tiny",
          "model_options={hidden_size: 64, num_layers: 1}",
          "warm_start={steps: 50, episodes: 8, holdout_episodes: 4, batch_size: 4, "
          "lr: 1.0e-3, target_success: 0.5, target_metric: greedy}",
          "curriculum={}"]


class Interrupted(Exception):
    """Stands for the process dying."""


def _passing(levels: set[int]):
    """A held-out estimate that passes at these hops (read from the demonstrations' prompt)."""
    def estimate(model, demonstrations, **kw):
        hops = int(re.search(r"for (\d+) hops", demonstrations[0].messages[1]["content"])[1])
        ok = float(hops in levels)
        return {"sampled": ok, "greedy": ok}
    return estimate


def _plan():
    return train_plan(load_config(None, RECIPE)).prepare


def _record(policy: str) -> dict:
    return json.loads((Path(policy) / start.WARM_RECORD).read_text())


def test_each_level_trains_until_its_check_passes(tmp_path, monkeypatch):
    monkeypatch.setattr(sft_module, "holdout_success", _passing({4, 8}))
    said: list[str] = []
    begun = start.prepare(_plan(), tmp_path / "run", say=said.append)
    record = _record(begun.policy)
    climbed = record["curriculum"]
    assert climbed["knob"] == "hops" and climbed["levels"] == [4, 8, 16]
    # 4 and 8 hops pass at their first check (every 10 steps); 16 uses the 30 steps left
    assert [(s["level"], s["steps"], s["reached"]) for s in climbed["stages"]] == [
        ("hops=4", 10, True), ("hops=8", 10, True), ("hops=16", 30, False)]
    assert climbed["level"] == 2 and begun.level == 2
    assert record["stopped_at_step"] == 50 and not record["reached_target"]
    assert record["demonstrations"] == 3 * 8
    assert any("level by level (hops=4, hops=8, hops=16)" in line for line in said)
    assert any(line.startswith("warm start at hops=8 stopped") for line in said)
    assert not (tmp_path / "run" / "model" / start.WARM_STATE).exists()


def test_rl_begins_where_the_warm_start_ran_out(tmp_path, monkeypatch):
    monkeypatch.setattr(sft_module, "holdout_success", _passing({4}))
    begun = start.prepare(_plan(), tmp_path / "run")
    stages = _record(begun.policy)["curriculum"]["stages"]
    assert [(s["level"], s["steps"], s["reached"]) for s in stages] == [
        ("hops=4", 10, True), ("hops=8", 40, False)]  # 16 hops never begins
    assert begun.level == 1 and start.reached_level(begun.policy, _plan().curriculum) == 1
    assert (Path(begun.policy) / "model.safetensors").exists()
    # --resume of the finished warm start starts RL at the same level
    again = start.resume(_plan(), tmp_path / "run", has_checkpoint=False)
    assert (again.policy, again.level) == (begun.policy, 1)
    # a run whose model is this warm start begins at its level (8 hops), on its own ladder
    for hops, level in ((16, 1), (64, 1), (8, 1), (4, 0)):
        plan = train_plan(load_config(None, [*RECIPE, f"model={begun.policy}", "warm_start=null",
                                             f"env_kwargs={{hops: {hops}}}"])).prepare
        assert start.prepare(plan, tmp_path / f"rl{hops}").level == level, hops
    no_curriculum = train_plan(load_config(None, [*RECIPE, f"model={begun.policy}",
                                                  "warm_start=null", "curriculum=null"])).prepare
    assert start.prepare(no_curriculum, tmp_path / "plain").level == 0


def test_a_warm_start_killed_in_its_second_level_resumes_to_the_same_weights(
        tmp_path, monkeypatch):
    monkeypatch.setattr(sft_module, "holdout_success", _passing({4, 8}))
    straight = start.prepare(_plan(), tmp_path / "a")
    real = sft_module.sft
    calls = []

    def dying(*args, callback, **kw):
        calls.append(1)

        def report(s):
            callback(s)
            if len(calls) == 2 and s.step == 7:  # mid-way through 8 hops
                raise Interrupted
        return real(*args, callback=report, **kw)

    monkeypatch.setattr(sft_module, "sft", dying)
    plan = _plan()
    plan = dataclasses.replace(plan, sft=dataclasses.replace(plan.sft, save_every_s=0.0))
    with pytest.raises(Interrupted):
        start.prepare(plan, tmp_path / "b")
    monkeypatch.setattr(sft_module, "sft", real)
    resumed = start.resume(plan, tmp_path / "b", has_checkpoint=False)
    files = sorted(p.name for p in Path(straight.policy).iterdir())
    assert files == sorted(p.name for p in Path(resumed.policy).iterdir())
    for name in files:
        a = (Path(straight.policy) / name).read_bytes()
        b = (Path(resumed.policy) / name).read_bytes()
        if name == start.WARM_RECORD:  # the settings differ in save_every_s only
            a, b = json.loads(a), json.loads(b)
            a["settings"].pop("save_every_s"), b["settings"].pop("save_every_s")
        assert a == b, name
    assert resumed.level == straight.level == 2


def test_a_harness_runs_levels_reach_its_tasks():
    """A harness run's demonstrations at each level come from tasks of that level."""
    harness = "agent.program=tests.gateway.harnesses:lookup_loop"
    plan = train_plan(load_config(None, [*RECIPE, harness])).prepare
    levels = start._levels(start.Demonstrations(plan.demonstrations), plan.curriculum)
    assert [d.plan.harness.tasks.env_kwargs["hops"] for d in levels] == [4, 8, 16]
    assert [d.plan.env.kwargs["hops"] for d in levels] == [4, 8, 16]
    assert [d.plan.harness.tasks.task(3)[1]["env_kwargs"] for d in levels] == [
        {"hops": 4}, {"hops": 8}, {"hops": 16}]
