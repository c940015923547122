from __future__ import annotations

import asyncio
import math
import time
from collections import Counter

import pytest
import torch

from sao_gym.inference import BackendClosed, HFBackend, InferenceBackend
from sao_gym.inference.sampling import sample_next
from sao_gym.models import load_policy, tiny_model
from sao_gym.types import SamplingParams

PROMPT = [1, 42, 17, 300, 5, 99, 2, 1, 600]


def prompts(n):
    """n distinct prompts of different lengths (1..n+3 tokens)."""
    return [[1] + [(37 * i + 11 * j) % 1000 + 3 for j in range(i % 7 + i // 3)] for i in range(n)]


@pytest.fixture(scope="module")
def other_model_path(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("tiny_seed1"), seed=1)


@pytest.fixture
async def backend(tiny_model_path):
    b = HFBackend(tiny_model_path, seed=0)
    yield b
    await b.aclose()


def reference_logp(model, prompt, tokens, temperature=1.0):
    """log_softmax(logits / T) at each generated position, from one fresh full forward pass."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits.double() / temperature, dim=-1)


def gathered(logp_TV, tokens):
    return logp_TV.gather(1, torch.tensor(tokens)[:, None]).squeeze(1)


# ------------------------------------------------------------------ sampling


def slow_sample(logits, temperature, top_p, u):
    """Per-row reference: sort, nucleus, renormalise, walk the CDF."""
    if temperature == 0:
        logp = torch.log_softmax(logits.double(), -1)
        tok = int(torch.argmax(logits))
        return tok, float(logp[tok])
    logp = torch.log_softmax(logits.double() / temperature, -1)
    order = sorted(range(len(logp)), key=lambda i: (-float(logp[i]), i))
    nucleus, mass = [], 0.0
    for i in order:
        if top_p < 1.0 and mass >= top_p:
            break
        nucleus.append(i)
        mass += math.exp(float(logp[i]))
    total = sum(math.exp(float(logp[i])) for i in nucleus)
    acc = 0.0
    for i in nucleus:
        acc += math.exp(float(logp[i]))
        if acc > u * total:
            return i, float(logp[i]) - math.log(total)
    return nucleus[-1], float(logp[nucleus[-1]]) - math.log(total)


def test_sample_next_matches_slow_reference():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(12, 50, generator=gen) * 3
    temps = torch.tensor(
        [0.0, 1.0, 0.7, 1.3, 1.0, 0.5, 1.0, 0.0, 2.0, 1.0, 0.9, 1.0], dtype=torch.float64
    )
    top_ps = torch.tensor(
        [1.0, 1.0, 1.0, 0.9, 0.5, 0.3, 0.95, 0.5, 1.0, 0.01, 0.8, 1.0], dtype=torch.float64
    )
    u = torch.rand(12, generator=gen, dtype=torch.float64)
    u[-1] = 0.999999999
    tokens, logprobs = sample_next(logits, temps, top_ps, u)
    for b in range(12):
        tok, lp = slow_sample(logits[b], float(temps[b]), float(top_ps[b]), float(u[b]))
        assert int(tokens[b]) == tok, b
        assert float(logprobs[b]) == pytest.approx(lp, abs=1e-9), b
    # top_p tiny: only the argmax is possible, with logprob 0
    assert int(tokens[9]) == int(logits[9].argmax()) and float(logprobs[9]) == pytest.approx(0.0)


# -------------------------------------------------------------- exactness


async def test_is_an_inference_backend(backend):
    assert isinstance(backend, InferenceBackend)
    assert backend.policy_version == 0


@pytest.mark.parametrize("temperature", [1.0, 0.7])
async def test_logprobs_match_a_fresh_forward_pass(backend, temperature):
    params = SamplingParams(max_new_tokens=24, temperature=temperature, seed=3)
    gen = await backend.generate(PROMPT, params)
    assert len(gen.token_ids) == 24 and gen.finish_reason == "length"
    assert gen.policy_versions == [0] * 24
    ref = gathered(reference_logp(backend.model, PROMPT, gen.token_ids, temperature), gen.token_ids)
    assert torch.allclose(torch.tensor(gen.logprobs, dtype=torch.float64), ref, atol=1e-4)
    assert len(set(gen.token_ids)) > 5  # sampled, not stuck


async def test_top_p_samples_inside_the_nucleus_with_renormalised_logprobs(backend):
    top_p, temperature = 0.3, 0.7
    params = SamplingParams(max_new_tokens=24, temperature=temperature, top_p=top_p, seed=5)
    gen = await backend.generate(PROMPT, params)
    logp_TV = reference_logp(backend.model, PROMPT, gen.token_ids, temperature)
    for t, (tok, lp) in enumerate(zip(gen.token_ids, gen.logprobs, strict=True)):
        sorted_lp, order = torch.sort(logp_TV[t], descending=True)
        probs = sorted_lp.exp()
        n_keep = int(((probs.cumsum(0) - probs) < top_p).sum())
        nucleus = order[:n_keep]
        assert tok in nucleus.tolist()
        assert n_keep < logp_TV.shape[1] // 2  # the filter really removed tokens
        expected = float(logp_TV[t, tok] - torch.logsumexp(sorted_lp[:n_keep], 0))
        assert lp == pytest.approx(expected, abs=1e-4)


async def test_greedy_logprob_is_untempered(backend):
    gen = await backend.generate(PROMPT, SamplingParams(max_new_tokens=8, temperature=0.0))
    logp = reference_logp(backend.model, PROMPT, gen.token_ids)
    assert gen.token_ids == logp.argmax(-1).tolist()
    assert torch.allclose(
        torch.tensor(gen.logprobs, dtype=torch.float64), gathered(logp, gen.token_ids), atol=1e-4
    )


# ---------------------------------------------------------------- batching


async def test_concurrent_requests_batch_and_match_running_alone(tiny_model_path):
    # float64 so that batching noise cannot flip a near-tie of the random model
    backend = HFBackend(tiny_model_path, dtype="float64", seed=0)
    try:
        ps = prompts(16)
        params = [
            SamplingParams(max_new_tokens=6 + (i * 5) % 17, temperature=0.0)
            if i % 2 == 0
            else SamplingParams(
                max_new_tokens=6 + (i * 5) % 17, temperature=1.0, top_p=0.9, seed=100 + i
            )
            for i in range(16)
        ]
        together = await asyncio.gather(
            *(backend.generate(p, q) for p, q in zip(ps, params, strict=True))
        )
        sizes = dict(backend.stats.batch_sizes)
        assert max(sizes) > 1, sizes
        alone = [await backend.generate(p, q) for p, q in zip(ps, params, strict=True)]
        assert set(backend.stats.batch_sizes - Counter(sizes)) == {1}  # each ran alone
        for i, (a, b) in enumerate(zip(together, alone, strict=True)):
            assert a.token_ids == b.token_ids, i
            assert len(a.token_ids) == params[i].max_new_tokens
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-9)
        # rows leave the batch as they finish: batch sizes shrink over the run
        assert len(sizes) > 3
    finally:
        await backend.aclose()


async def test_request_arriving_mid_batch_joins_the_running_batch(tiny_model_path):
    backend = HFBackend(tiny_model_path, dtype="float64")
    try:
        long_task = asyncio.create_task(
            backend.generate(PROMPT, SamplingParams(max_new_tokens=150, temperature=0.0))
        )
        while backend.stats.tokens_generated < 10:
            await asyncio.sleep(0.002)
        short = await backend.generate([1, 7, 8], SamplingParams(max_new_tokens=5, temperature=0.0))
        assert not long_task.done()  # the short request did not wait for the long one
        assert backend.stats.batch_sizes[2] >= 4
        long_gen = await long_task
        assert (
            short.token_ids == (await backend.generate([1, 7, 8], SamplingParams(5, 0.0))).token_ids
        )
        assert (
            long_gen.token_ids
            == (await backend.generate(PROMPT, SamplingParams(150, 0.0))).token_ids
        )
    finally:
        await backend.aclose()


async def test_same_seed_same_sample(backend):
    params = SamplingParams(max_new_tokens=10, temperature=1.0, seed=42)
    a, b = await asyncio.gather(backend.generate(PROMPT, params), backend.generate(PROMPT, params))
    c = await backend.generate(PROMPT, SamplingParams(max_new_tokens=10, temperature=1.0, seed=43))
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids


async def test_stop_tokens_and_length(backend):
    free = await backend.generate(PROMPT, SamplingParams(max_new_tokens=10, temperature=0.0))
    assert free.finish_reason == "length" and len(free.token_ids) == 10
    stop = free.token_ids[4]
    first = free.token_ids.index(stop)
    gen = await backend.generate(
        PROMPT, SamplingParams(max_new_tokens=10, temperature=0.0, stop_token_ids=(stop,))
    )
    assert gen.finish_reason == "stop"
    assert gen.token_ids == free.token_ids[: first + 1]  # the stop token is kept


async def test_generation_is_capped_by_the_model_positions(backend):
    prompt = [5] * 4090
    gen = await backend.generate(prompt, SamplingParams(max_new_tokens=50, temperature=0.0))
    assert gen.finish_reason == "length" and len(gen.token_ids) == 6


async def test_bad_inputs_raise_value_error(backend):
    params = SamplingParams(max_new_tokens=4)
    for bad in ([], [1, -1], [1, 1024], [0.5], [1] * 4096):
        with pytest.raises(ValueError):
            await backend.generate(bad, params)
    with pytest.raises(TypeError):
        await backend.generate([1], {"max_new_tokens": 4})
    # the backend still works afterwards
    assert len((await backend.generate([1], params)).token_ids) == 4


# ----------------------------------------------------------------- weights


async def test_in_flight_weight_update(tiny_model_path, other_model_path):
    backend = HFBackend(tiny_model_path, seed=0)
    old_model, _ = load_policy(tiny_model_path)
    new_model, _ = load_policy(other_model_path)
    try:
        task = asyncio.create_task(
            backend.generate(PROMPT, SamplingParams(max_new_tokens=300, temperature=1.0, seed=1))
        )
        while backend.stats.tokens_generated < 20:
            await asyncio.sleep(0.002)
        await backend.update_weights(new_model.state_dict(), version=7)
        assert backend.policy_version == 7
        gen = await task
    finally:
        await backend.aclose()
    assert len(gen.token_ids) == 300
    assert set(gen.policy_versions) == {0, 7}
    k = gen.policy_versions.index(7)
    assert 20 <= k < 300 and gen.policy_versions == [0] * k + [7] * (300 - k)
    lp = torch.tensor(gen.logprobs, dtype=torch.float64)
    old_ref = gathered(reference_logp(old_model, PROMPT, gen.token_ids), gen.token_ids)
    new_ref = gathered(reference_logp(new_model, PROMPT, gen.token_ids), gen.token_ids)
    assert torch.allclose(lp[:k], old_ref[:k], atol=1e-4)
    assert torch.allclose(lp[k:], new_ref[k:], atol=1e-4)
    assert not torch.allclose(lp[k:], old_ref[k:], atol=1e-2)  # the weights really changed
    assert backend.stats.weight_updates == 1


async def test_update_weights_from_a_directory_and_bad_state_dicts(backend, other_model_path):
    new_model, _ = load_policy(other_model_path)
    await backend.update_weights(other_model_path, version=3)
    gen = await backend.generate(PROMPT, SamplingParams(max_new_tokens=8, temperature=0.0))
    assert gen.policy_versions == [3] * 8
    assert gen.token_ids == reference_logp(new_model, PROMPT, gen.token_ids).argmax(-1).tolist()
    with pytest.raises(ValueError, match="unknown weight names"):
        await backend.update_weights({"nope.weight": torch.zeros(2)}, version=4)
    with pytest.raises(ValueError, match="shape"):
        await backend.update_weights({"model.norm.weight": torch.zeros(3)}, version=4)
    with pytest.raises(FileNotFoundError):
        await backend.update_weights("/nonexistent/checkpoint", version=4)
    assert backend.policy_version == 3
    again = await backend.generate(PROMPT, SamplingParams(max_new_tokens=8, temperature=0.0))
    assert again.token_ids == gen.token_ids


# --------------------------------------------------------------- lifecycle


async def test_event_loop_stays_responsive(backend):
    ticks: list[float] = []

    async def ticker():
        while True:
            ticks.append(time.monotonic())
            await asyncio.sleep(0.005)

    t = asyncio.create_task(ticker())
    start = time.monotonic()
    await asyncio.gather(
        *(backend.generate(p, SamplingParams(max_new_tokens=100)) for p in prompts(4))
    )
    elapsed = time.monotonic() - start
    t.cancel()
    gaps = [b - a for a, b in zip(ticks, ticks[1:], strict=False)]
    assert elapsed > 0.1
    assert len(ticks) > elapsed / 0.005 / 4
    assert max(gaps) < 0.1


async def test_aclose_fails_pending_and_later_calls(tiny_model_path):
    backend = HFBackend(tiny_model_path)
    running = asyncio.create_task(backend.generate(PROMPT, SamplingParams(max_new_tokens=2000)))
    while backend.stats.tokens_generated < 3:
        await asyncio.sleep(0.002)
    await backend.aclose()
    with pytest.raises(BackendClosed):
        await running
    with pytest.raises(BackendClosed):
        await backend.generate(PROMPT, SamplingParams())
    with pytest.raises(BackendClosed):
        await backend.update_weights({}, version=1)
    await backend.aclose()  # idempotent
    assert backend.closed


async def test_worker_errors_fail_the_request_not_the_worker(backend):
    real = backend._runner
    calls = {"n": 0}

    class Flaky:
        def __getattr__(self, name):
            return getattr(real, name)

        def __call__(self, *args):
            calls["n"] += 1
            if calls["n"] == 1:
                raise RuntimeError("boom")
            return real(*args)

    backend._runner = Flaky()
    with pytest.raises(RuntimeError, match="boom"):
        await backend.generate(PROMPT, SamplingParams(max_new_tokens=4))
    gen = await backend.generate(PROMPT, SamplingParams(max_new_tokens=4))
    assert len(gen.token_ids) == 4


async def test_cancelled_request_leaves_the_batch(backend):
    task = asyncio.create_task(backend.generate(PROMPT, SamplingParams(max_new_tokens=3000)))
    while backend.stats.tokens_generated < 3:
        await asyncio.sleep(0.002)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.05)
    generated = backend.stats.tokens_generated
    await asyncio.sleep(0.05)
    assert backend.stats.tokens_generated == generated < 3000
    assert len((await backend.generate(PROMPT, SamplingParams(max_new_tokens=3))).token_ids) == 3
