"""RL climbs a curriculum: episodes play the level they were admitted at, the level rises
with training success, and checkpoints keep it."""

import asyncio
import json
import random
from pathlib import Path

import pytest

from sao_gym.curriculum import LEVEL_METRIC, Curriculum
from sao_gym.runtime.loop.source import RolloutSource
from sao_gym.runtime.loop.trainer import Trainer
from sao_gym.types import Rollout, StopReason
from tests.runtime.fakes import FakeLearner, ListSink, token_backend

REWARD = {4: lambda seed: 1.0, 8: lambda seed: float(seed % 2 == 0), 16: lambda seed: 0.0}
"""What an episode at each level earns: all succeed at 4 hops, half at 8, none at 16."""


class Saved:
    def __init__(self) -> None:
        self.states: list[dict] = []

    def save(self, step, learner, trainer_state):
        self.states.append(json.loads(json.dumps(trainer_state)))
        return Path(f"step_{step}")


async def _run(group_size: int, demote_below: float = 0.0):
    played: list[tuple[int, int]] = []  # (task seed, hops)

    async def play(seed: int, sample_seed: int = 0, env_kwargs=None) -> Rollout:
        await asyncio.sleep(random.random() * 1e-3)
        hops = env_kwargs["hops"]
        played.append((seed, hops))
        return Rollout([1, 2], [0, 1], [0.0, -0.1], [-1, 0], REWARD[hops](seed), True, False,
                       StopReason.TERMINATED, False, [], "x", str(seed), seed,
                       metrics={"hops": float(hops)})

    curriculum = Curriculum("hops", (4, 8, 16), promote_at=0.5, window=8,
                            demote_below=demote_below)
    source = RolloutSource(play, batch_size=4, group_size=group_size, concurrency=6,
                           max_staleness=1, difficulty=curriculum.current)
    learner = FakeLearner(random.Random(0))
    sink, saved = ListSink(), Saved()
    trainer = Trainer(source=source, learner=learner, backend=token_backend(random.Random(0)),
                      sink=sink, checkpoints=saved, total_steps=12, checkpoint_every=3,
                      curriculum=curriculum)
    await asyncio.wait_for(trainer.arun(), timeout=20)
    return curriculum, learner, sink, saved, played


@pytest.mark.parametrize("group_size", [1, 2])
async def test_the_level_rises_with_training_success_and_is_checkpointed(group_size):
    curriculum, learner, sink, saved, played = await _run(group_size)
    trained = [r for batch in learner.batches for r in batch]
    levels = (4, 8, 16)
    for r in trained:  # each episode played the level it records
        assert levels[int(r.metrics[LEVEL_METRIC])] == r.metrics["hops"]
    groups: dict[int, set[float]] = {}
    for r in trained:
        groups.setdefault(r.group_id, set()).add(r.metrics[LEVEL_METRIC])
    assert all(len(g) == 1 for g in groups.values())  # a group plays one level
    logged = [m["curriculum/level"] for _, m in sink.rows]
    assert logged == sorted(logged) and logged[-1] == 2.0  # up, never down, to the top
    # it moved up at 4 hops once 8 episodes at that level were counted (all successes) ...
    first_at_8 = next(i for i, level in enumerate(logged) if level == 1.0)
    counted = sum(r.metrics[LEVEL_METRIC] == 0 for b in learner.batches[:first_at_8 + 1]
                  for r in b)
    assert counted >= 8
    assert sum(r.metrics[LEVEL_METRIC] == 0 for b in learner.batches[:first_at_8]
               for r in b) < 8
    # ... and 16 hops, where nothing succeeds, is the end: the curriculum stays there
    assert curriculum.top and any(h == 16 for _, h in played)
    assert saved.states[-1]["curriculum"]["index"] == 2
    assert [s["curriculum"]["index"] for s in saved.states] == sorted(
        s["curriculum"]["index"] for s in saved.states)


async def test_a_level_whose_episodes_stop_succeeding_sends_rl_back_down(caplog):
    """At 16 hops nothing succeeds (a collapse): with ``demote_below`` RL goes back to 8 hops,
    where half succeed, once a full window at 16 has failed, and climbs again from there."""
    with caplog.at_level("WARNING", logger="sao_gym.runtime.loop.trainer"):
        curriculum, learner, sink, _, _ = await _run(1, demote_below=0.25)
    logged = [m["curriculum/level"] for _, m in sink.rows]
    drops = [i for i in range(1, len(logged)) if logged[i] < logged[i - 1]]
    assert drops and all(logged[i - 1] == 2.0 and logged[i] == 1.0 for i in drops)
    warned = [r.getMessage() for r in caplog.records if "moves back down" in r.getMessage()]
    assert len(warned) == len(drops) and "hops=8" in warned[0]
    # each drop came after a full window (8 episodes) at 16 hops had all failed
    first = drops[0]
    at_16 = [r for b in learner.batches[:first + 1] for r in b if r.metrics[LEVEL_METRIC] == 2]
    assert len(at_16) >= 8 and all(r.reward == 0.0 for r in at_16)
    # after the drop, episodes are admitted at 8 hops again
    later = [r.metrics[LEVEL_METRIC] for b in learner.batches[first + 2:] for r in b]
    assert 1.0 in later


def test_a_placement_continues_at_its_checkpoints_level(tmp_path):
    from sao_gym.runtime.parts import RunParts

    template = Curriculum("hops", (4, 8, 16), window=4)
    parts = RunParts(learner=None, rollouts=None, source=None, sink=None, total_steps=1,
                     seed=0, concurrency=1, checkpoint_every=0, checkpoint_keep=1,
                     curriculum=template)
    assert parts.climb().index == 0 and parts.climb() is not template
    assert parts.starting_at(1).climb().index == 1  # where the warm start ended
    assert parts.starting_at(7).climb().index == 2  # never past the top
    checkpoint = tmp_path / "step_0000005"
    checkpoint.mkdir()
    state = Curriculum("hops", (4, 8, 16), window=4, index=1).state_dict()
    state["recent"] = [True, False]
    (checkpoint / "trainer.json").write_text(json.dumps({"step": 5, "next_seed": 9,
                                                         "curriculum": state}))
    resumed = parts.climb(checkpoint)
    assert resumed.index == 1 and resumed.success == 0.5
    assert template.index == 0  # the template is never changed
    (checkpoint / "trainer.json").write_text(json.dumps({"step": 5, "next_seed": 9}))
    assert parts.climb(checkpoint).index == 0  # a checkpoint from before the curriculum


def test_the_config_sets_the_demotion_floor():
    from sao_gym.runtime.config.build import train_plan
    from sao_gym.runtime.config.loader import load_config, recipe_path
    from sao_gym.runtime.config.schema import ConfigError

    base = ["env=sao_gym/KeyChain-v0", "env_kwargs={hops: 16}", "model=tiny"]
    parts = train_plan(load_config(None, [*base, "curriculum={demote_below: 0.1}"])).parts
    assert parts.curriculum.demote_below == 0.1 and parts.curriculum.levels == (4, 8, 16)
    recipe = train_plan(load_config(recipe_path("cpu"), base)).parts.curriculum
    assert recipe.demote_below == 0.05  # the CPU recipe's floor
    for bad in ("-0.1", "0.5", "0.9"):  # must lie in [0, promote_at = 0.5)
        with pytest.raises(ConfigError, match="demote_below"):
            load_config(None, [*base, f"curriculum={{demote_below: {bad}}}"])
