"""Harness episodes through the gateway are token-exact, a weight update mid-episode included.

Real harnesses, unmodified, on KeyChain tasks with the tiny model (HF backend):
the openai client in a loop (in-process), an OpenAI Agents SDK agent (a command
harness, its own process) and mini-swe-agent (on CodeRepo, in a thread; each of its
malformed replies starts a segment, each segment checked in its own context).
While an episode runs, the backend loads other weights; every action token's
stored logprob must equal a fresh forward of the weights that sampled it, the
stored tokens must be the sampled ones (never the harness's text re-tokenized),
and a call's prompt must be the episode so far.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
import torch

from sao_gym.gateway.harness import Harness
from sao_gym.gateway.rollouts import HarnessRollouts
from sao_gym.gateway.tasks import TaskSource
from sao_gym.inference.hf import HFBackend
from sao_gym.models import load_policy, tiny_model

ROOT = Path(__file__).resolve().parents[2]
KEYCHAIN = TaskSource(env="sao_gym/KeyChain-v0", env_kwargs={"hops": 3})
HARNESSES = {  # harness, its tasks, the distribution it needs
    "openai_loop": (Harness("examples.harnesses.openai_loop:run", timeout_s=120), KEYCHAIN,
                    None),
    "agents_sdk": (Harness(command=(sys.executable,
                                    str(ROOT / "examples/harnesses/agents_sdk.py")),
                           timeout_s=120), KEYCHAIN, "openai-agents"),
    "mini_swe": (Harness("examples.harnesses.mini_swe:run", timeout_s=180),
                 TaskSource(env="sao_gym/CodeRepo-v0", env_kwargs={"tasks": "humaneval"}),
                 "mini-swe-agent"),
}


@pytest.fixture(scope="module")
def other_model_path(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("tiny_seed1"), seed=1)


def require_distribution(name: str) -> None:
    """Skip unless ``name`` is installed (its package is not importable here: this
    repository's ``agents/`` folder has the Agents SDK's top-level name)."""
    from importlib import metadata

    try:
        metadata.version(name)
    except metadata.PackageNotFoundError:
        pytest.skip(f"{name} is not installed")


def fresh_logprobs(model, ids: list[int]) -> list[float]:
    """log p(token t | tokens < t) for t >= 1, one full forward, float64 softmax."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].double()
    logp = torch.log_softmax(logits, -1)
    return [0.0] + logp.gather(1, torch.tensor(ids[1:])[:, None]).squeeze(1).tolist()


@pytest.mark.parametrize("name", list(HARNESSES))
async def test_every_action_token_is_the_sampled_one_with_its_exact_logprob(
        tiny_model_path, other_model_path, name):
    harness, tasks, needs = HARNESSES[name]
    if needs is not None:
        require_distribution(needs)
    backend = HFBackend(tiny_model_path, max_batch_size=4, seed=0)
    sampled: list[list[int]] = []
    generate = backend.generate

    async def recording(prompt, params):
        gen = await generate(prompt, params)
        sampled.append(list(gen.token_ids))
        return gen

    backend.generate = recording
    new_model, _ = load_policy(other_model_path)
    runs = HarnessRollouts(harness, tasks, backend, backend.tokenizer, max_new_tokens=48,
                           max_context_tokens=8192)

    async def update_mid_episode():
        while backend.stats.tokens_generated < 20:
            await asyncio.sleep(0.002)
        await backend.update_weights(new_model.state_dict(), version=7)

    updater = asyncio.ensure_future(update_mid_episode())
    try:
        ro = await runs.play(0, sample_seed=5)
        await asyncio.wait_for(updater, 5)
    finally:
        updater.cancel()
        await runs.aclose()
    assert not ro.infra_failure, ro
    versions = {v for v, m in zip(ro.policy_versions, ro.loss_mask, strict=True) if m}
    assert versions == {0, 7}  # the weights changed while the episode ran
    old_model, tok = load_policy(tiny_model_path)
    models = {0: old_model, 7: new_model}
    checked = 0
    for start, stop in ro.segment_spans:
        ids = ro.token_ids[start:stop]
        fresh = {v: fresh_logprobs(m, ids) for v, m in models.items()}
        for t in range(stop - start):
            if ro.loss_mask[start + t]:
                v = ro.policy_versions[start + t]
                assert abs(ro.rollout_logprobs[start + t] - fresh[v][t]) < 1e-4, (t, v)
                checked += 1
    assert checked == ro.num_action_tokens > 0
    # the stored action tokens are the sampled ones, call by call, in order
    actions = [t for t, m in zip(ro.token_ids, ro.loss_mask, strict=True) if m]
    assert actions == [t for gen in sampled for t in gen]
    # ...where the harness's text of them would tokenize otherwise (random-model text)
    redrawn = [tok.encode(tok.decode(gen), add_special_tokens=False) for gen in sampled]
    assert any(r != gen for r, gen in zip(redrawn, sampled, strict=True))
    assert ro.metrics["turns"] == len(sampled)
    if name == "openai_loop":  # 6 calls, one segment: each call's prompt reuses the KV kept
        assert ro.metrics["turns"] >= 3 and backend.stats.reused_tokens > 0
