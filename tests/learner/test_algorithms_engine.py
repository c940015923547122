"""Algorithms as records of functions, and the engine under the learner.

- a fake engine (a logit table, no model) drives ``Learner.update``: the learner
  only talks to engines;
- an algorithm defined in a module outside the repository (REINFORCE with a
  batch-mean baseline) is found by ``module:NAME`` and trains, from Python
  and from the command line;
- ``mismatch/masked_share`` uses the learner's configured band.
"""

import json
import math
import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch

from sao_gym.learner import losses
from sao_gym.learner.algorithms import ALGORITHMS, Algorithm, find_algorithm
from sao_gym.learner.batching import micro_batches
from sao_gym.learner.engine import SINGLE
from sao_gym.learner.learner import Learner, LearnerConfig, build_learner
from tests.learner.helpers import sampler_logprobs, segments_rollout

REINFORCE_MODULE = textwrap.dedent('''
    """REINFORCE with a batch-mean baseline, as a user writes it."""
    from sao_gym.learner import losses
    from sao_gym.learner.algorithms import Algorithm


    def batch_mean(batch):
        rewards = [r.reward for r in batch.rollouts]
        mean = sum(rewards) / len(rewards)
        return batch.per_rollout([r - mean for r in rewards])


    def policy_gradient(logprobs, reference, advantages, mask, *, eps_low, eps_high,
                        aggregation, num_tokens, num_seqs):
        loss = losses.aggregate(-(advantages * logprobs), mask, aggregation,
                                num_tokens=num_tokens, num_seqs=num_seqs)
        return loss, {}


    REINFORCE = Algorithm("reinforce", batch_mean, policy_gradient, eps=(0.3, 5.0))
''')


@pytest.fixture
def algo_dir(tmp_path, monkeypatch):
    folder = tmp_path / "user"
    folder.mkdir()
    (folder / "my_algos.py").write_text(REINFORCE_MODULE)
    monkeypatch.syspath_prepend(str(folder))
    return folder


class TableEngine:
    """An :class:`~sao_gym.learner.engine.Engine` over a logit table: the same logits
    ``table[V]`` at every position, SGD, no ``nn.Module`` model."""

    def __init__(self, vocab: int):
        self.table = torch.zeros(vocab, requires_grad=True)
        self.device, self.keeps_logits, self.scores_tokens = torch.device("cpu"), False, False
        self.group = SINGLE
        self.lrs: list[float] = []
        self.steps = 0

    def forward(self, input_ids, attention_mask, method="forward"):
        B, T = input_ids.shape
        return SimpleNamespace(logits=self.table.expand(B, T, -1))

    def to_device(self, mb):
        return mb

    def train(self):
        pass

    def backward(self, loss):
        loss.backward()

    def set_lr(self, lr):
        self.lrs.append(lr)

    def step(self, *, finite=True):
        norm = float(self.table.grad.norm())
        with torch.no_grad():
            self.table -= self.lrs[-1] * self.table.grad
        self.table.grad = None
        self.steps += 1
        return norm, True

    def weights(self):
        return {"table": self.table.detach()}


def _rollouts(vocab=8):
    """Two rollouts: action token 3 rewarded, action token 5 not (a prompt token 1 each)."""
    lp = math.log(1 / vocab)  # the table starts uniform: the sampler's logprob
    return [segments_rollout([([1], False), ([3, 3], True)], 1.0, task_id="a",
                             logprobs=[0.0, lp, lp]),
            segments_rollout([([1], False), ([5, 5], True)], 0.0, task_id="b",
                             logprobs=[0.0, lp, lp])]


def test_a_fake_engine_drives_the_update_without_a_model():
    engine = TableEngine(8)
    config = LearnerConfig(lr=0.5, lr_warmup_steps=2)
    learner = Learner("running_mean", engine, None, config)
    m = learner.update(_rollouts())
    # running mean with no history: advantages 1 and 0; lr warm-up: half the rate at step 0
    assert engine.lrs == [0.25] and engine.steps == 1 and learner.policy_version == 1
    assert m["advantage/mean"] == pytest.approx(0.5)
    table = engine.table.detach()
    assert table[3] > 0 > table[5] and table[3] == table.max()
    # token_mean over 4 action tokens of -(A * logp): d/d table[3] of -(2/4) log p(3)
    p = 1 / 8
    assert float(table[3]) == pytest.approx(0.25 * 0.5 * (1 - p), rel=1e-5)
    assert m["loss/policy"] == pytest.approx(-0.5 * math.log(p), rel=1e-5)
    learner.update(_rollouts())
    assert engine.lrs[-1] == 0.5 and learner.steps_done == 2


def test_an_algorithm_from_a_module_outside_the_repository_trains(algo_dir, tiny_model_path):
    record = find_algorithm("my_algos:REINFORCE")
    assert not record.critic and record.name == "reinforce" and record.eps == (0.3, 5.0)
    engine = TableEngine(8)
    learner = Learner("my_algos:REINFORCE", engine, None, LearnerConfig(lr=1.0))
    m = learner.update(_rollouts())
    # batch mean 0.5: advantages +0.5 and -0.5; loss -(0.5 * 2 logp + -0.5 * 2 logp) / 4 = 0
    assert m["advantage/mean"] == pytest.approx(0.0) and m["loss/policy"] == pytest.approx(0.0)
    table = engine.table.detach()
    assert float(table[3]) == pytest.approx(-float(table[5]), rel=1e-5) and table[3] > 0
    # a real model through build_learner: one step changes the weights
    real = build_learner(record, tiny_model_path, LearnerConfig(lr=1e-3))
    before = {n: p.clone() for n, p in real.policy.state_dict().items()}
    ids = [[1, 2, 3, 4, 5], [1, 2, 6, 7, 8]]
    rollouts = [segments_rollout([(i[:2], False), (i[2:], True)], float(k == 0),
                                 logprobs=[0.0] * 5) for k, i in enumerate(ids)]
    real.update(rollouts)
    assert any(not torch.equal(before[n], p) for n, p in real.policy.state_dict().items())


def test_find_algorithm_says_what_is_wrong(algo_dir):
    assert find_algorithm("sao") is ALGORITHMS["sao"]
    with pytest.raises(ValueError, match="unknown algorithm 'ppo'"):
        find_algorithm("ppo")
    with pytest.raises(ValueError, match="cannot import 'nowhere_xyz'"):
        find_algorithm("nowhere_xyz:ALGO")
    with pytest.raises(ValueError, match="missing, not a sao_gym"):
        find_algorithm("my_algos:PPO")
    with pytest.raises(ValueError, match="function, not a sao_gym"):
        find_algorithm("my_algos:batch_mean")
    with pytest.raises(ValueError, match="reference must be one of"):
        Algorithm("x", print, print, (0.2, 0.2), reference="teacher")


def test_the_mismatch_metric_uses_the_configured_band(tiny_model_path):
    learner = build_learner("grpo_dis", tiny_model_path, LearnerConfig(
        lr=1e-3, eps_low=0.001, eps_high=0.001), group_size=2)
    assert learner.band == (0.001, 0.001)
    ids = [1, 2, 3, 4, 5, 6]
    exact = sampler_logprobs(learner.policy, ids)
    # two action tokens at ratio 1, two at exp(-0.01): inside DIS's default band, not this one
    off = [x + d for x, d in zip(exact, [0, 0, 0, 0.01, 0, 0.01], strict=True)]
    rollouts = [segments_rollout([(ids[:2], False), (ids[2:], True)], r, task_id="t",
                                 logprobs=off) for r in (0.0, 1.0)]
    (mb,) = micro_batches(rollouts, 1 << 16)
    with torch.no_grad():
        logprobs = learner.score(mb)[0]
    narrow = losses.sampler_mismatch(logprobs, mb.rollout_logprobs_BT, mb.action_mask_BT,
                                     eps_low=0.001, eps_high=0.001)
    default = losses.sampler_mismatch(logprobs, mb.rollout_logprobs_BT, mb.action_mask_BT)
    m = learner.update(rollouts)
    assert float(narrow["masked_share"]) == pytest.approx(0.5)
    assert float(default["masked_share"]) == 0.0
    assert m["mismatch/masked_share"] == pytest.approx(0.5)


@pytest.mark.slow
def test_the_cli_trains_an_algorithm_of_ones_own(algo_dir, tmp_path):
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(algo_dir),
                                                         os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "sao_gym.cli", "train", "--set", "algorithm=my_algos:REINFORCE",
         "--set", "env=sao_gym/Arithmetic-v0", "--set", "total_steps=5",
         "--set", "rollout.batch_size=4", "--set", "rollout.concurrency=4",
         "--set", "warm_start=null", "--set", "eval.episodes=0", "--set", "checkpoint.every=5",
         "--set", "model_options={hidden_size: 64, num_layers: 1}", "--out", str(run)],
        capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "loss/policy" in s]
    assert len(steps) == 5 and not any("loss/value" in s for s in steps)
    assert (run / "checkpoints" / "step_0000005" / "policy").is_dir()
