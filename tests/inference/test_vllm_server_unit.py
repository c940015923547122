"""VLLMServerBackend without a model: the request it sends, the checks it makes, failures.

The HTTP cases run against small fake servers (aiohttp, in-process on
127.0.0.1) that speak just enough of vLLM's protocol; the real servers are
exercised in test_served.py.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from sao_gym.inference.base import BackendClosed
from sao_gym.inference.router import NoServersAvailable
from sao_gym.inference.vllm_server import (
    ServerConfigError,
    VLLMServerBackend,
    check_server_info,
    completion_body,
)
from sao_gym.types import SamplingParams
from tests.inference.fake_server import GOOD_INFO, MAX_LEN, MODELS, Fake

# ------------------------------------------------------------------ completion_body


def test_completion_body_sends_every_sampling_field_explicitly():
    params = SamplingParams(max_new_tokens=99, temperature=0.7, top_p=0.9,
                            stop_token_ids=(2, 5))
    body = completion_body("m", [1, 2, 3], params, 17)
    assert body["model"] == "m" and body["prompt"] == [1, 2, 3]
    assert body["max_tokens"] == 17  # as passed, not params.max_new_tokens
    assert body["temperature"] == 0.7 and body["top_p"] == 0.9
    assert body["top_k"] == -1 and body["min_p"] == 0.0 and body["min_tokens"] == 0
    assert body["repetition_penalty"] == 1.0
    assert body["presence_penalty"] == 0.0 and body["frequency_penalty"] == 0.0
    assert body["ignore_eos"] is True
    assert body["logprobs"] == 0 and body["n"] == 1
    assert body["return_token_ids"] is True and body["stream"] is True
    assert body["stop_token_ids"] == [2, 5] and body["stop"] == []
    assert body["detokenize"] is False and body["echo"] is False
    assert "seed" not in body
    json.dumps(body)  # serialisable as is


def test_completion_body_sends_the_seed_only_when_given():
    body = completion_body("m", [1], SamplingParams(4, seed=0), 4)
    assert body["seed"] == 0  # 0 is a seed, not "none"
    assert completion_body("m", [1], SamplingParams(4, seed=123), 4)["seed"] == 123


def test_completion_body_names_the_session_as_the_user_only_when_given():
    assert "user" not in completion_body("m", [1], SamplingParams(4), 4)
    assert completion_body("m", [1], SamplingParams(4, session_id="ep-3"), 4)["user"] == "ep-3"


# ------------------------------------------------------------------ check_server_info


def test_check_server_info_wrong_model_name_names_the_flag():
    with pytest.raises(ServerConfigError, match="--served-model-name policy") as err:
        check_server_info("http://h:1", "policy", {"data": [{"id": "Qwen/Qwen3-0.6B"}]},
                          GOOD_INFO)
    assert "Qwen/Qwen3-0.6B" in str(err.value) and "http://h:1" in str(err.value)


def test_check_server_info_without_server_info_names_dev_mode():
    with pytest.raises(ServerConfigError, match="VLLM_SERVER_DEV_MODE=1"):
        check_server_info("http://h:1", "policy", MODELS, None)


@pytest.mark.parametrize("config", [
    {"vllm_config": {"model_config": {"logprobs_mode": "raw_logprobs"}}},
    {"vllm_config": {"model_config": {}}},
    {"vllm_config": "not a dict"},
])
def test_check_server_info_wrong_logprobs_mode_names_the_flag(config):
    with pytest.raises(ServerConfigError, match="--logprobs-mode processed_logprobs"):
        check_server_info("http://h:1", "policy", MODELS, config)


def test_check_server_info_refuses_chunked_prefill_on_the_cpu_only():
    def info(device, chunked):
        return {"vllm_config": {"model_config": {"logprobs_mode": "processed_logprobs"},
                                "device_config": {"device": device},
                                "scheduler_config": {"enable_chunked_prefill": chunked}}}

    with pytest.raises(ServerConfigError, match="--no-enable-chunked-prefill") as err:
        check_server_info("http://h:1", "policy", MODELS, info("cpu", True))
    assert "http://h:1" in str(err.value)
    for ok in (info("cpu", False), info("cuda", True)):
        assert check_server_info("u", "policy", MODELS, ok) == {"max_model_len": MAX_LEN}


def test_launched_vllm_prefills_whole_prompts_within_one_step():
    from sao_gym.inference.launch import vllm_command

    for max_len, budget in ((768, 2048), (16384, 16384)):
        cmd = vllm_command("python", "m", 8000, max_model_len=max_len)
        assert "--no-enable-chunked-prefill" in cmd
        assert int(cmd[cmd.index("--max-num-batched-tokens") + 1]) == budget


def test_check_server_info_good_returns_max_model_len():
    assert check_server_info("u", "policy", MODELS, GOOD_INFO) == {"max_model_len": MAX_LEN}
    # a card without max_model_len: no limit known
    got = check_server_info("u", "policy", {"data": [{"id": "policy"}]}, GOOD_INFO)
    assert got["max_model_len"] >= 1 << 20


P = SamplingParams(max_new_tokens=8, stop_token_ids=(2,))


async def test_start_checks_each_server_and_tells_it_the_version(serve, make_backend):
    a, b = await serve(Fake(), Fake())
    backend = make_backend([a, b], policy_version=4)
    await backend.start()
    await backend.start()  # idempotent
    for f in (a, b):
        assert [p for p, _ in f.calls] == ["/v1/models", "/server_info",
                                           "/update_weight_version"]
        assert f.calls[-1][1] == {"new_version": "4"}
    assert [s.info["max_model_len"] for s in backend.router.servers] == [MAX_LEN, MAX_LEN]
    assert [s.version for s in backend.router.servers] == [4, 4]


async def test_start_without_server_info_is_a_config_error(serve, make_backend):
    (a,) = await serve(Fake(server_info=False))
    with pytest.raises(ServerConfigError, match="VLLM_SERVER_DEV_MODE=1"):
        await make_backend([a]).start()
    assert a.count("/server_info") == 1  # a 404 is not retried


async def test_a_stream_is_assembled_and_the_request_is_capped_by_the_context(serve,
                                                                            make_backend):
    (a,) = await serve(Fake())
    backend = make_backend([a])
    prompt = list(range(3, 3 + MAX_LEN - 5))
    g = await backend.generate(prompt, SamplingParams(max_new_tokens=50, seed=9))
    assert g.token_ids == [11, 12, 13]
    assert g.logprobs == [-0.5, -1.5, -0.25]
    assert g.finish_reason == "length"
    body = a.bodies[0]
    assert body["max_tokens"] == 5 and body["prompt"] == prompt and body["seed"] == 9
    with pytest.raises(ValueError, match="no room"):
        await backend.generate(list(range(3, 3 + MAX_LEN)), P)
    assert a.count("/v1/completions") == 1


async def test_a_500_is_retried_then_the_server_is_taken_out_and_another_serves(
        serve, make_backend):
    bad, good = await serve(Fake(completions="500"), Fake(versions=[20, 21, 22]))
    backend = make_backend([bad, good], retries=2)
    g = await backend.generate([1, 2, 3], P)
    assert bad.count("/v1/completions") == 3  # the first attempt and 2 retries
    assert good.count("/v1/completions") == 1
    assert g.policy_versions == [20, 21, 22]  # only the good server answers these
    dead, alive = backend.router.servers
    assert not dead.alive and "HTTP 500" in dead.dead_reason and "engine dead" in dead.dead_reason
    assert alive.alive and alive.served == 1 and dead.served == 0
    assert [s.outstanding for s in backend.router.servers] == [0.0, 0.0]
    assert [s.in_flight for s in backend.router.servers] == [0, 0]
    # later requests never go back to the dead one
    await backend.generate([1, 2, 3], P)
    assert bad.count("/v1/completions") == 3 and good.count("/v1/completions") == 2


async def test_a_connection_dropped_mid_stream_is_retried_then_another_serves(
        serve, make_backend):
    bad, good = await serve(Fake(completions="drop", versions=[1, 1, 1]),
                            Fake(versions=[30, 31, 32]))
    backend = make_backend([bad, good], retries=1)
    g = await backend.generate([1, 2, 3], P)
    assert bad.count("/v1/completions") == 2
    assert g.token_ids == [11, 12, 13]  # not the partial tokens of the dropped streams
    assert g.policy_versions == [30, 31, 32]
    assert not backend.router.servers[0].alive and backend.router.servers[1].alive


async def test_a_stream_that_ends_without_a_finish_reason_is_retried_elsewhere(
        serve, make_backend):
    bad, good = await serve(Fake(completions="cut"), Fake(versions=[1, 2, 3]))
    backend = make_backend([bad, good], retries=1)
    g = await backend.generate([1, 2, 3], P)
    assert bad.count("/v1/completions") == 2 and g.policy_versions == [1, 2, 3]
    assert "without a finish reason" in backend.router.servers[0].dead_reason


async def test_every_server_failing_raises_no_servers_available(serve, make_backend):
    a, b = await serve(Fake(completions="500"), Fake(completions="drop"))
    backend = make_backend([a, b], retries=0)
    with pytest.raises(NoServersAvailable) as err:
        await backend.generate([1, 2, 3], P)
    assert a.url in str(err.value) and b.url in str(err.value)
    assert a.count("/v1/completions") == 1 and b.count("/v1/completions") == 1


async def test_a_400_is_a_value_error_with_the_servers_message_and_keeps_the_server(
        serve, make_backend):
    (a,) = await serve(Fake(completions="400"))
    backend = make_backend([a])
    with pytest.raises(ValueError, match="max_tokens is too large") as err:
        await backend.generate([1, 2, 3], P)
    assert "HTTP 400" in str(err.value)
    assert a.count("/v1/completions") == 1  # not retried
    assert backend.router.servers[0].alive
    assert backend.router.servers[0].in_flight == 0


async def test_token_versions_come_from_the_stream_or_from_the_known_server_version(
        serve, make_backend):
    labelled, plain = await serve(Fake(versions=[7, 8, 8]), Fake())
    b1 = make_backend([labelled], policy_version=3)
    assert (await b1.generate([1], P)).policy_versions == [7, 8, 8]
    b2 = make_backend([plain], policy_version=3)
    assert (await b2.generate([1], P)).policy_versions == [3, 3, 3]
    await b2.update_weights("/some/weights", 5)
    assert (await b2.generate([1], P)).policy_versions == [5, 5, 5]


async def test_a_token_arriving_after_the_reload_gets_the_new_version(serve, make_backend):
    # no per-token versions from the server: a chunk is labelled with the version
    # the client knows its server has when the chunk arrives
    (a,) = await serve(Fake(completions="hold"))
    backend = make_backend([a], policy_version=3)
    gen = asyncio.ensure_future(backend.generate([1], P))
    await asyncio.wait_for(a.streaming.wait(), 5)  # the first chunk is out
    await backend.update_weights("/w4", 4)
    g = await asyncio.wait_for(gen, 5)
    assert g.token_ids == [11, 12, 13]
    assert g.policy_versions == [3, 3, 4]


UPDATE = ["/pause", "/collective_rpc", "/update_weight_version", "/resume"]


def _update_calls(f: Fake) -> list[tuple[str, object]]:
    start = 3  # /v1/models, /server_info, /update_weight_version of start()
    return f.calls[start:]


async def test_update_weights_pauses_reloads_versions_and_resumes_every_server(
        serve, make_backend, tmp_path):
    a, b = await serve(Fake(), Fake())
    backend = make_backend([a, b])
    await backend.update_weights(str(tmp_path / "w7"), 7)
    for f in (a, b):
        calls = _update_calls(f)
        assert [p for p, _ in calls] == UPDATE
        assert calls[0][1]["mode"] == "keep"
        assert calls[1][1] == {"method": "reload_weights",
                               "kwargs": {"weights_path": str(tmp_path / "w7")}}
        assert calls[2][1] == {"new_version": "7"}
    assert backend.policy_version == 7
    assert [s.version for s in backend.router.servers] == [7, 7]


async def test_update_weights_with_a_state_dict_publishes_it_for_the_servers(
        serve, make_backend, tmp_path):
    import torch

    from sao_gym.inference.weights import load_weights_dir

    (a,) = await serve(Fake())
    backend = make_backend([a])
    await backend.update_weights({"w": torch.arange(4.0)}, 2)
    path = _update_calls(a)[1][1]["kwargs"]["weights_path"]
    assert path.startswith(str(tmp_path / "sync"))
    assert torch.equal(load_weights_dir(path)["w"], torch.arange(4.0))


async def test_a_failed_reload_still_resumes_and_takes_the_server_out(serve, make_backend,
                                                                     tmp_path):
    bad, good = await serve(Fake(reload="500"), Fake())
    backend = make_backend([bad, good], retries=1, policy_version=1)
    await backend.update_weights(str(tmp_path / "w"), 2)
    bad_calls = [p for p, _ in _update_calls(bad)]
    assert bad_calls == ["/pause", "/collective_rpc", "/collective_rpc", "/resume"]
    assert [p for p, _ in _update_calls(good)] == UPDATE
    dead, alive = backend.router.servers
    assert not dead.alive and "weight update failed" in dead.dead_reason
    assert dead.version == 1 and alive.version == 2 and alive.alive
    assert backend.policy_version == 2
    # generation goes on on the server that took the update
    g = await backend.generate([1], P)
    assert g.policy_versions == [2, 2, 2]
    assert bad.count("/v1/completions") == 0


async def test_a_failed_reload_on_the_last_server_raises_no_servers_available(
        serve, make_backend, tmp_path):
    (bad,) = await serve(Fake(reload="500"))
    backend = make_backend([bad], retries=0, policy_version=1)
    with pytest.raises(NoServersAvailable, match="weight update failed"):
        await backend.update_weights(str(tmp_path / "w"), 2)
    assert [p for p, _ in _update_calls(bad)] == ["/pause", "/collective_rpc", "/resume"]
    assert backend.policy_version == 1  # the update did not happen


async def test_aclose_makes_later_calls_raise_backend_closed(serve, make_backend):
    (a,) = await serve(Fake())
    closed = []
    backend = make_backend([a], on_close=lambda: closed.append(True))
    await backend.generate([1], P)
    await backend.aclose()
    await backend.aclose()  # idempotent
    assert closed == [True]
    with pytest.raises(BackendClosed):
        await backend.generate([1], P)
    with pytest.raises(BackendClosed):
        await backend.update_weights("/w", 1)
    assert a.count("/v1/completions") == 1


async def test_aclose_removes_its_own_sync_dir(serve):
    (a,) = await serve(Fake())
    backend = VLLMServerBackend([a.url], retries=0, backoff_s=0.01)
    await backend.start()
    root = backend._sync.publisher.root
    assert root.is_dir()
    await backend.aclose()
    assert not root.exists()
