"""`mode: sync` with a fixed seed is reproducible: two runs, the same checkpoint bit for bit.

Each episode samples with its own seed (run seed, task, member, attempt) and a
sync run's hf backend decodes each sequence alone, so nothing depends on
timing; the learner then sees the same batches in the same order.
"""

import pytest
import torch
from safetensors.torch import load_file

from sao_gym.cli import main
from sao_gym.learner.state import read_state
from sao_gym.logging import read_metrics
from sao_gym.utils.tensors import differing, tensors

RUN = ["--set", "env=sao_gym/HeavyTail-v0", "--set",
       "env_kwargs={latency_median_s: 0.005, latency_sigma: 1.0, turns_median: 2}",
       "--set", "mode=sync", "--set", "total_steps=5", "--set", "checkpoint.every=5",
       "--set", "rollout.batch_size=4", "--set", "rollout.concurrency=4",
       "--set", "rollout.max_new_tokens=12", "--set", "rollout.max_episode_steps=2",
       "--set", "rollout.max_context_tokens=512", "--set", "learner.critic_warmup_steps=1",
       "--set", "warm_start=null", "--set", "eval.episodes=0",
       "--set", "model_options={hidden_size: 64, num_layers: 1}"]
TIMING = ("time/", "perf/", "learner/step_time_s", "learner/policy_time_s",
          "learner/critic_time_s")


def _train(out, *extra):
    assert main(["train", *RUN, *extra, "--out", str(out)]) == 0
    state = read_state(out / "checkpoints" / "step_0000005")
    rows = [{k: v for k, v in row.items() if not k.startswith(TIMING)}
            for row in read_metrics(out)]
    return state, rows


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["sao", "grpo"])
def test_two_sync_runs_with_one_seed_give_identical_checkpoints(tmp_path, algorithm):
    extra = ["--set", f"algorithm={algorithm}", "--set", "seed=5"]
    if algorithm == "grpo":
        extra += ["--set", "rollout.group_size=2"]
    a, rows_a = _train(tmp_path / "a", *extra)
    b, rows_b = _train(tmp_path / "b", *extra)
    assert a["steps_done"] == b["steps_done"] == 5
    # the same rollouts, step by step (returns, lengths, advantages, losses)
    assert rows_a == rows_b
    assert sum(r["learner/action_tokens"] for r in rows_a) > 0
    assert 0 < sum(r["rollout/return_mean"] for r in rows_a) < 5  # rewards vary: a signal
    parts = ["policy", "policy_opt"] + (["critic", "critic_opt"] if algorithm == "sao" else [])
    for part in parts:
        assert len(dict(tensors(a[part]))) > 1
        assert differing(a[part], b[part]) == [], part
    # training moved the weights: the equality is not that of two untouched copies
    start = load_file(tmp_path / "a" / "model" / "base" / "model.safetensors")
    assert any(not torch.equal(start[k], a["policy"][k]) for k in start if k in a["policy"])
