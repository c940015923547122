"""A LoRA learner's adapter reaches the sampler: HF in-process, `sao-gym serve`, real vLLM.

`mode: sync` runs with `learner.lora.rank: 8`: on every step after the first
the importance ratio is 1 within 1e-3 and nothing is clipped, so the tokens
were sampled by the adapter the learner trained; the servers were sent the
adapter alone (an adapter directory), vLLM loading it with its own LoRA
layers. The sampler check after each update is what stops a run whose
sampler does not apply the adapter: shown on a backend that never got it.
"""

from __future__ import annotations

import sys

import pytest

from sao_gym.cli import main
from sao_gym.logging import read_metrics
from tests.inference.test_served import _need

pytest.importorskip("peft")

RUN = ["--set", "mode=sync", "--set", "learner.lora.rank=8", "--set", "total_steps=5",
       "--set", "rollout.batch_size=4", "--set", "rollout.max_new_tokens=12",
       "--set", "rollout.max_episode_steps=2", "--set", "rollout.max_context_tokens=512",
       "--set", "learner.critic_warmup_steps=0", "--set", "learner.lr=1e-2",
       "--set", "warm_start=null", "--set", "eval.episodes=0",
       "--set", "model_options={hidden_size: 64, num_layers: 1}"]
BACKENDS = {
    "hf": [],
    "sao": ["inference.backend=vllm_server", "inference.launch=1", "inference.server=sao"],
    "vllm": ["inference.backend=vllm_server", "inference.launch=1", "inference.server=vllm",
             f"inference.server_python={sys.executable}"],
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["hf", "sao", pytest.param("vllm", marks=pytest.mark.vllm)])
def test_sync_lora_runs_sample_with_the_adapter_the_learner_trained(kind, tmp_path):
    _need(kind)
    run = tmp_path / "run"
    extra = [a for kv in BACKENDS[kind] for a in ("--set", kv)]
    assert main(["train", *RUN, *extra, "--out", str(run)]) == 0
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    for r in rows[1:]:
        assert abs(r["sao/ratio_mean"] - 1.0) < 1e-3, r
        assert r["sao/clip_ratio"] == 0.0, r
        assert r["check/sampler_logprob_gap"] < 1e-3, r
    if kind != "hf":  # the servers were sent adapter directories, no full weights
        published = sorted((run / "weights").iterdir())
        assert published and all((p / "adapter_model.safetensors").is_file()
                                 and not (p / "model.safetensors").exists() for p in published)


async def test_the_check_stops_a_sampler_that_does_not_apply_the_adapter(tiny_model_path):
    from sao_gym.inference.hf.backend import HFBackend
    from sao_gym.learner.config import LearnerConfig, LoraSettings
    from sao_gym.learner.learner import build_learner
    from sao_gym.runtime.loop.probe import SamplerCheck, SamplerMismatch
    from tests.learner.helpers import random_batch

    learner = build_learner("grpo", tiny_model_path, LearnerConfig(
        lr=1e-2, lora=LoraSettings(rank=8)), group_size=2)
    rollouts = random_batch(learner.policy, 4, seed=6, group_size=2)
    for _ in range(3):
        learner.update(rollouts)
    check = SamplerCheck(tolerance=1e-3)
    check.take_prompt(rollouts)
    stale = HFBackend(tiny_model_path, policy_version=learner.policy_version)
    fresh = HFBackend(tiny_model_path)
    try:
        with pytest.raises(SamplerMismatch, match="not using the weights the learner trained"):
            await check.check(stale, learner, learner.policy_version)  # the base model samples
        await fresh.update_weights(learner.weights(), learner.policy_version)
        assert await check.check(fresh, learner, learner.policy_version) < 1e-4
        with pytest.raises(SamplerMismatch, match="policy version"):
            await check.check(fresh, learner, learner.policy_version + 1)
    finally:
        await stale.aclose()
        await fresh.aclose()
