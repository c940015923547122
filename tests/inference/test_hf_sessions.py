"""KV reuse across the turns of an episode: exact logprobs, bounded memory, weight updates."""

from __future__ import annotations

import asyncio

import pytest
import torch

from sao_gym.inference import HFBackend
from sao_gym.inference.hf.sessions import SessionCache, SessionEntry
from sao_gym.models import load_policy, tiny_model
from sao_gym.types import SamplingParams
from tests.inference.test_hf import gathered, reference_logp


@pytest.fixture(scope="module")
def other_model_path(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("tiny_seed1"), seed=1)


def entry(tokens, version=0, per_token=4):
    kv = [torch.zeros(1, 1, len(tokens), per_token)]
    return SessionEntry(list(tokens), version, kv, [t.clone() for t in kv])


def test_an_entry_is_taken_only_for_a_longer_prompt_it_prefixes_at_its_version():
    cache = SessionCache(max_bytes=10**6)
    for prompt, version, hit in [([1, 2, 3, 4], 0, True), ([1, 2, 3], 0, False),
                                 ([1, 9, 3, 4], 0, False), ([1, 2, 3, 4], 1, False)]:
        cache.put("s", entry([1, 2, 3]))
        got = cache.take("s", prompt, version)
        assert (got is not None) == hit, (prompt, version)
        assert len(cache) == 0 and cache.nbytes == 0  # taken or dropped: gone either way
    assert cache.take("unknown", [1, 2], 0) is None


def test_the_budget_evicts_the_least_recently_kept_and_refuses_what_cannot_fit():
    one = entry([1, 2, 3]).nbytes  # 3 tokens x 4 values x 4 bytes x (keys + values) = 96
    cache = SessionCache(max_bytes=2 * one)
    cache.put("a", entry([1, 2, 3]))
    cache.put("b", entry([4, 5, 6]))
    cache.put("a", entry([1, 2, 3]))  # replacing does not double-count
    assert cache.nbytes == 2 * one and cache.evictions == 0
    cache.put("c", entry([7, 8, 9]))  # evicts b, the oldest kept
    assert cache.take("b", [4, 5, 6, 7], 0) is None and cache.evictions == 1
    assert cache.take("a", [1, 2, 3, 4], 0) is not None
    cache.put("big", entry(list(range(10))))  # larger than the budget: not kept
    assert cache.take("big", list(range(11)), 0) is None and cache.nbytes == one
    with pytest.raises(ValueError):
        SessionCache(-1)


async def play(backend, turns, session, *, update_at=None, new_weights=None, seed=0):
    """An episode: each turn's prompt is the last one + its sampled tokens + an observation."""
    prompt, out = [1, 42, 17, 300, 5], []
    for t in range(turns):
        if update_at is not None and t == update_at:
            await backend.update_weights(new_weights, version=1)
        params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=seed * 1000 + t,
                                session_id=session)
        gen = await backend.generate(prompt, params)
        out.append((list(prompt), gen))
        prompt = prompt + gen.token_ids + [7 + t % 5, 90 + t, 3]  # an observation's tokens
    return out


async def test_a_20_turn_episode_with_an_update_at_turn_10_matches_fresh_forwards(
        tiny_model_path, other_model_path):
    old, _ = load_policy(tiny_model_path)
    new, _ = load_policy(other_model_path)
    backend = HFBackend(tiny_model_path, seed=0)
    try:
        turns = await play(backend, 20, "ep", update_at=10, new_weights=new.state_dict())
        stats = backend.stats
    finally:
        await backend.aclose()
    for t, (prompt, gen) in enumerate(turns):
        assert set(gen.policy_versions) == {0 if t < 10 else 1}
        model = old if t < 10 else new
        ref = gathered(reference_logp(model, prompt, gen.token_ids), gen.token_ids)
        assert torch.allclose(torch.tensor(gen.logprobs, dtype=torch.float64), ref, atol=1e-4), t
    # turns 1-9 and 11-19 reused the previous turn's KV; turn 10 could not (new weights)
    prompts = [len(p) for p, _ in turns]
    expected_reused = sum(prompts[t - 1] + len(turns[t - 1][1].token_ids) - 1  # last not fed
                          for t in range(1, 20) if t != 10)
    assert stats.reused_tokens == expected_reused
    assert stats.prefill_tokens == sum(prompts) - expected_reused
    assert stats.prefill_tokens < sum(prompts) / 3


async def test_without_a_session_or_with_no_budget_every_turn_is_prefilled_whole(
        tiny_model_path):
    for session, budget in ((None, 2**30), ("ep", 0)):
        backend = HFBackend(tiny_model_path, seed=0, session_cache_bytes=budget)
        try:
            turns = await play(backend, 5, session)
            assert backend.stats.reused_tokens == 0
            assert backend.stats.prefill_tokens == sum(len(p) for p, _ in turns)
            assert len(backend.sessions) == 0
        finally:
            await backend.aclose()


async def test_concurrent_episodes_keep_their_own_caches_and_tokens_match_no_reuse(
        tiny_model_path):
    async def run(budget):
        backend = HFBackend(tiny_model_path, seed=0, session_cache_bytes=budget)
        try:
            return await asyncio.gather(*(play(backend, 6, f"ep{i}", seed=i) for i in range(4))), \
                backend.stats.reused_tokens
        finally:
            await backend.aclose()

    (with_reuse, reused), (without, none) = await run(2**30), await run(0)
    assert reused > 0 and none == 0
    for a, b in zip(with_reuse, without, strict=True):
        for (pa, ga), (pb, gb) in zip(a, b, strict=True):
            # seeded sampling from logits equal up to float noise: the same tokens
            assert pa == pb and ga.token_ids == gb.token_ids
            assert max(abs(x - y) for x, y in zip(ga.logprobs, gb.logprobs, strict=True)) < 1e-4


def test_a_sync_run_of_long_episodes_reuses_kv_and_trains_on_policy(tmp_path):
    """``mode: sync`` on KeyChain with 16 hops (episodes of up to 21 turns), KV reuse on:
    the learner's ratio to the sampler is 1 and nothing is clipped, and the backend took
    most prompt tokens from its session cache."""
    from sao_gym.cli import main
    from sao_gym.logging import read_metrics

    sets = ["mode=sync", "env=sao_gym/KeyChain-v0", "env_kwargs={hops: 16}", "total_steps=3",
            "rollout.batch_size=2", "rollout.max_new_tokens=8", "rollout.max_episode_steps=null",
            "rollout.max_context_tokens=2048", "learner.critic_warmup_steps=0",
            "learner.lr=1e-3", "warm_start=null", "curriculum=null",
            "eval.episodes=0",
            "model_options={hidden_size: 64, num_layers: 1}"]
    run = tmp_path / "run"
    assert main(["train", *[a for kv in sets for a in ("--set", kv)], "--out", str(run)]) == 0
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert r["rollout/turns_mean"] >= 10, r  # long episodes (an untrained model wanders)
        assert abs(r["sao/ratio_mean"] - 1.0) < 1e-3, r
        assert r["sao/clip_ratio"] == 0.0, r
    last = rows[-1]
    assert last["inference/reused_tokens"] > 2 * last["inference/prefill_tokens"], last
