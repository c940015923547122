"""``sao-gym serve``'s application: request parsing, the routes, pause, reloads, keep-alives.

The app runs in-process (aiohttp's test server) over a ScriptedBackend, or a
tiny HFBackend where the weights must really change. VLLMServerBackend
against the real ``sao-gym serve`` is in test_served.py.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp.test_utils import TestClient, TestServer

from sao_gym.inference.scripted import ScriptedBackend
from sao_gym.inference.server import build_app, parse_completion
from sao_gym.inference.vllm_server import check_server_info
from sao_gym.types import Generation

EOS = (0, 7)


# ------------------------------------------------------------------ parse_completion


def body(**kw):
    return {"model": "policy", "prompt": [1, 2, 3], **kw}


def test_parse_completion_reads_the_sampling_fields():
    prompt, params, stream = parse_completion(
        body(max_tokens=9, temperature=0.5, top_p=0.8, stop_token_ids=[4], seed=3,
             ignore_eos=True, stream=True, top_k=-1, n=1, logprobs=0, min_p=0.0,
             repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0, stop=[]),
        "policy", EOS)
    assert prompt == [1, 2, 3] and stream is True
    assert (params.max_new_tokens, params.temperature, params.top_p) == (9, 0.5, 0.8)
    assert params.stop_token_ids == (4,) and params.seed == 3
    assert params.session_id is None
    assert parse_completion(body(user="ep-1"), "policy", EOS)[1].session_id == "ep-1"
    with pytest.raises(ValueError, match="user must be a string"):
        parse_completion(body(user=7), "policy", EOS)


def test_parse_completion_defaults_and_a_nested_prompt():
    prompt, params, stream = parse_completion({"prompt": [[5, 6]]}, "policy", ())
    assert prompt == [5, 6] and stream is False
    assert params.max_new_tokens == 16 and params.temperature == 1.0 and params.seed is None


def test_without_ignore_eos_the_eos_ids_stop_too():
    _, params, _ = parse_completion(body(stop_token_ids=[4, 7]), "policy", EOS)
    assert params.stop_token_ids == (4, 7, 0)  # 7 not twice
    _, params, _ = parse_completion(body(ignore_eos=False), "policy", EOS)
    assert params.stop_token_ids == EOS
    _, params, _ = parse_completion(body(stop_token_ids=[4], ignore_eos=True), "policy", EOS)
    assert params.stop_token_ids == (4,)


@pytest.mark.parametrize("prompt", ["hello", [], [[]], [1, "2"], [1, 2.0], [True], None])
def test_parse_completion_rejects_text_and_empty_prompts(prompt):
    with pytest.raises(ValueError, match="prompt must be a non-empty list of token ids"):
        parse_completion(body(prompt=prompt), "policy", EOS)


@pytest.mark.parametrize("field, value", [
    ("top_k", 5), ("n", 2), ("presence_penalty", 0.5), ("frequency_penalty", -1.0),
    ("repetition_penalty", 1.1), ("min_p", 0.1), ("logprobs", 5), ("echo", True),
])
def test_parse_completion_rejects_unsupported_fields(field, value):
    with pytest.raises(ValueError, match=f"{field}={value!r} is not supported"):
        parse_completion(body(**{field: value}), "policy", EOS)


def test_parse_completion_rejects_stop_strings_seeds_models_and_bodies():
    with pytest.raises(ValueError, match="stop strings are not supported"):
        parse_completion(body(stop=["\n"]), "policy", EOS)
    for seed in ["1", 1.5]:
        with pytest.raises(ValueError, match="seed must be an integer"):
            parse_completion(body(seed=seed), "policy", EOS)
    with pytest.raises(ValueError, match="'other' is not served here"):
        parse_completion(body(model="other"), "policy", EOS)
    with pytest.raises(ValueError, match="JSON object"):
        parse_completion([1, 2], "policy", EOS)
    with pytest.raises(ValueError, match="stop_token_ids"):
        parse_completion(body(stop_token_ids=["a"]), "policy", EOS)
    with pytest.raises(ValueError, match="max_new_tokens"):
        parse_completion(body(max_tokens=0), "policy", EOS)


# ------------------------------------------------------------------ the app


@pytest.fixture
async def serve():
    """``await serve(backend, **build_app_kwargs)`` -> a TestClient; closed at the end."""
    clients: list[TestClient] = []

    async def start(backend, **kw) -> TestClient:
        kw = {"max_model_len": 128, "eos_token_ids": EOS, **kw}
        client = TestClient(TestServer(build_app(backend, **kw), host="127.0.0.1"))
        await client.start_server()
        clients.append(client)
        return client

    yield start
    for c in clients:
        await c.close()


def generation(prompt, params):
    n = min(3, params.max_new_tokens)
    return Generation(token_ids=[100 + i for i in range(n)],
                      logprobs=[-0.1 * (i + 1) for i in range(n)],
                      finish_reason="length", policy_versions=[4, 4, 5][:n])


def sse_data(text: str) -> list:
    return [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]


async def test_a_completion_returns_the_backends_generation(serve):
    backend = ScriptedBackend(generation)
    client = await serve(backend)
    resp = await client.post("/v1/completions", json=body(max_tokens=5, seed=2, stop_token_ids=[9],
                                                          temperature=0.3))
    assert resp.status == 200
    out = await resp.json()
    (choice,) = out["choices"]
    assert choice["token_ids"] == [100, 101, 102]
    assert choice["logprobs"]["token_logprobs"] == pytest.approx([-0.1, -0.2, -0.3])
    assert choice["finish_reason"] == "length" and choice["stop_reason"] is None
    assert choice["policy_versions"] == [4, 4, 5]
    assert out["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
    assert out["model"] == "policy" and out["object"] == "text_completion"
    (call,) = backend.calls
    assert call.prompt_ids == [1, 2, 3]
    assert call.params.max_new_tokens == 5 and call.params.seed == 2
    assert call.params.temperature == 0.3
    assert call.params.stop_token_ids == (9, *EOS)


async def test_a_streamed_completion_carries_the_same_fields_and_ends_with_done(serve):
    backend = ScriptedBackend([[50, 51, 7]])  # ends on an eos id: a stop
    client = await serve(backend)
    resp = await client.post("/v1/completions", json=body(max_tokens=8, stream=True))
    assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
    data = sse_data(await resp.text())
    assert data[-1] == "[DONE]" and len(data) == 2
    (choice,) = json.loads(data[0])["choices"]
    assert choice["token_ids"] == [50, 51, 7]
    assert choice["logprobs"]["token_logprobs"] == [0.0, 0.0, 0.0]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == 7
    assert choice["policy_versions"] == [0, 0, 0]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_backend_value_error_is_a_400(serve, stream):
    def refuse(prompt, params):
        raise ValueError("prompt of 3 tokens leaves no room")

    client = await serve(ScriptedBackend(refuse))
    resp = await client.post("/v1/completions", json=body(stream=stream))
    assert resp.status == 400
    assert (await resp.json())["error"]["message"] == "prompt of 3 tokens leaves no room"


async def test_bad_requests_get_vllms_error_shape(serve):
    backend = ScriptedBackend(generation)
    client = await serve(backend)
    resp = await client.post("/v1/completions", data=b"{not json",
                             headers={"Content-Type": "application/json"})
    assert resp.status == 400
    err = (await resp.json())["error"]
    assert set(err) == {"message", "type", "code"}
    assert err["type"] == "BadRequestError" and err["code"] == 400
    assert "not JSON" in err["message"]
    resp = await client.post("/v1/completions", json=body(top_k=5))
    assert resp.status == 400
    assert "top_k=5 is not supported" in (await resp.json())["error"]["message"]
    assert backend.calls == []  # nothing reached the backend


async def test_models_and_server_info_pass_the_clients_checks(serve):
    client = await serve(ScriptedBackend(generation), model="pol", max_model_len=77)
    models = await (await client.get("/v1/models")).json()
    info = await (await client.get("/server_info")).json()
    assert info["vllm_config"]["model_config"]["logprobs_mode"] == "processed_logprobs"
    assert check_server_info("u", "pol", models, info) == {"max_model_len": 77}
    assert (await (await client.get("/health")).text()) == "ok"


async def test_pause_holds_new_requests_until_resume(serve):
    backend = ScriptedBackend(generation)
    client = await serve(backend)
    resp = await client.post("/pause", params={"mode": "keep"})
    assert resp.status == 200
    assert (await (await client.get("/is_paused")).json()) == {"is_paused": True}
    pending = asyncio.ensure_future(client.post("/v1/completions", json=body()))
    await asyncio.sleep(0.2)
    assert not pending.done() and backend.calls == []
    assert (await client.post("/resume")).status == 200
    resp = await asyncio.wait_for(pending, 5)
    assert resp.status == 200 and len(backend.calls) == 1
    assert (await resp.json())["choices"][0]["token_ids"] == [100, 101, 102]
    assert (await (await client.get("/is_paused")).json()) == {"is_paused": False}


async def test_pause_modes_other_than_keep_are_refused(serve):
    client = await serve(ScriptedBackend(generation))
    resp = await client.post("/pause")  # vLLM's default mode is abort
    assert resp.status == 400 and "'abort'" in (await resp.json())["error"]["message"]
    assert (await (await client.get("/is_paused")).json()) == {"is_paused": False}


async def test_collective_rpc_refuses_a_missing_dir_and_other_methods(serve, tmp_path):
    client = await serve(ScriptedBackend(generation))
    missing = str(tmp_path / "nope")
    resp = await client.post("/collective_rpc", json={"method": "reload_weights",
                                                      "kwargs": {"weights_path": missing}})
    assert resp.status == 400
    assert f"cannot read weights from {missing}" in (await resp.json())["error"]["message"]
    resp = await client.post("/collective_rpc", json={"method": "sleep"})
    assert resp.status == 400 and "reload_weights" in (await resp.json())["error"]["message"]
    resp = await client.post("/collective_rpc", json={"method": "reload_weights"})
    assert resp.status == 400 and "weights_path" in (await resp.json())["error"]["message"]
    resp = await client.post("/update_weight_version", json={"new_version": "x"})
    assert resp.status == 400


async def test_update_weight_version_changes_weight_info(serve):
    backend = ScriptedBackend(lambda p, s: [5], policy_version=2)
    client = await serve(backend)
    assert (await (await client.get("/weight_info")).json()) == {"weight_version": "2"}
    resp = await client.post("/update_weight_version", json={"new_version": "7"})
    assert (await resp.json()) == {"success": True, "new_version": "7"}
    assert backend.weight_updates == [7]
    assert (await (await client.get("/weight_info")).json()) == {"weight_version": "7"}
    out = await (await client.post("/v1/completions", json=body())).json()
    assert out["choices"][0]["policy_versions"] == [7]


async def test_keep_alive_comments_while_a_generation_runs(serve):
    async def slow(prompt, params):
        await asyncio.sleep(0.35)
        return [42]

    client = await serve(ScriptedBackend(slow), keepalive_s=0.05)
    resp = await client.post("/v1/completions", json=body(stream=True))
    text = await resp.text()
    assert resp.status == 200
    assert text.count(": keep-alive\n\n") >= 3
    assert text.index(": keep-alive") < text.index("data: ")  # before the data
    data = sse_data(text)
    assert json.loads(data[0])["choices"][0]["token_ids"] == [42] and data[1] == "[DONE]"


async def test_a_fast_stream_has_no_keep_alive(serve):
    client = await serve(ScriptedBackend([[42]]), keepalive_s=5)
    text = await (await client.post("/v1/completions", json=body(stream=True))).text()
    assert "keep-alive" not in text and sse_data(text)[-1] == "[DONE]"


async def test_closing_the_app_closes_the_backend(serve):
    backend = ScriptedBackend([[1]])
    client = await serve(backend)
    await client.close()
    assert backend._closed


# ------------------------------------------------------------------ real weights (HFBackend)


async def test_a_reload_really_changes_the_weights(serve, tiny_model_path, tmp_path):
    import torch

    from sao_gym.inference.hf.backend import HFBackend
    from sao_gym.inference.weights import save_weights_dir

    backend = HFBackend(tiny_model_path, seed=0)
    original = {k: v.clone() for k, v in backend.model.state_dict().items()}
    sharp = {k: v.clone() for k, v in original.items()}
    sharp["model.norm.weight"] *= 3.0  # logits x3: same greedy tokens, other logprobs
    save_weights_dir(sharp, tmp_path / "sharp")
    save_weights_dir(original, tmp_path / "orig")
    client = await serve(backend, max_model_len=4096)
    req = body(prompt=[5, 17, 300, 42], max_tokens=6, temperature=0.0, ignore_eos=True)

    async def complete():
        out = await (await client.post("/v1/completions", json=req)).json()
        choice = out["choices"][0]
        choice["logprobs"] = choice["logprobs"]["token_logprobs"]
        return choice

    async def reload(path, version):
        resp = await client.post("/collective_rpc", json={
            "method": "reload_weights", "kwargs": {"weights_path": str(path)}})
        assert resp.status == 200, await resp.text()
        resp = await client.post("/update_weight_version", json={"new_version": str(version)})
        assert resp.status == 200, await resp.text()

    before = await complete()
    assert before["policy_versions"] == [0] * 6
    # staging alone changes nothing: the swap happens at /update_weight_version
    resp = await client.post("/collective_rpc", json={
        "method": "reload_weights", "kwargs": {"weights_path": str(tmp_path / "sharp")}})
    assert resp.status == 200
    assert (await complete())["logprobs"] == before["logprobs"]
    assert (await (await client.get("/weight_info")).json()) == {"weight_version": "0"}
    await client.post("/update_weight_version", json={"new_version": "1"})
    after = await complete()
    assert (await (await client.get("/weight_info")).json()) == {"weight_version": "1"}
    assert after["policy_versions"] == [1] * 6
    assert after["token_ids"] == before["token_ids"]
    lp0 = torch.tensor(before["logprobs"], dtype=torch.float64)
    lp1 = torch.tensor(after["logprobs"], dtype=torch.float64)
    assert (lp1 - lp0).abs().max() > 1e-3
    assert torch.equal(backend.model.state_dict()["model.norm.weight"], sharp["model.norm.weight"])
    # back to the original weights: the original logprobs again
    await reload(tmp_path / "orig", 2)
    again = await complete()
    assert again["policy_versions"] == [2] * 6
    assert again["logprobs"] == pytest.approx(before["logprobs"], abs=1e-6)


async def test_weights_that_do_not_fit_are_a_400_and_leave_the_model_alone(serve, tiny_model_path,
                                                                          tmp_path):
    import torch

    from sao_gym.inference.hf.backend import HFBackend
    from sao_gym.inference.weights import save_weights_dir

    backend = HFBackend(tiny_model_path, seed=0)
    norm = backend.model.state_dict()["model.norm.weight"].clone()
    save_weights_dir({"model.norm.weight": torch.ones(3)}, tmp_path / "bad")
    client = await serve(backend, max_model_len=4096)
    resp = await client.post("/collective_rpc", json={
        "method": "reload_weights", "kwargs": {"weights_path": str(tmp_path / "bad")}})
    assert resp.status == 200  # read fine; the shapes are checked on the swap
    resp = await client.post("/update_weight_version", json={"new_version": "3"})
    assert resp.status == 400
    assert "do not fit" in (await resp.json())["error"]["message"]
    assert backend.policy_version == 0
    assert torch.equal(backend.model.state_dict()["model.norm.weight"], norm)


async def test_a_lora_adapter_is_merged_into_the_base_weights_each_time(serve, tiny_model_path,
                                                                        tmp_path):
    """``/v1/load_lora_adapter``: the adapter alone arrives; each new one replaces the last
    (merged into the weights the model had before the first), not added on top."""
    import torch

    from sao_gym.inference.hf.backend import HFBackend
    from sao_gym.inference.weights import save_adapter_dir

    backend = HFBackend(tiny_model_path, seed=0)
    base = backend.model.state_dict()["model.layers.0.self_attn.q_proj.weight"].clone()
    g = torch.Generator().manual_seed(0)
    a = torch.randn(4, base.shape[1], generator=g)
    b = torch.randn(base.shape[0], 4, generator=g) * 0.1
    name = "model.layers.0.self_attn.q_proj"
    for version, scale in ((1, 1.0), (2, 2.0)):
        save_adapter_dir({f"{name}.lora_A.weight": a, f"{name}.lora_B.weight": b * scale},
                         tmp_path / f"v{version}")
    client = await serve(backend, max_model_len=4096)
    resp = await client.post("/v1/load_lora_adapter", json={"lora_name": "x"})
    assert resp.status == 400 and "lora_path" in (await resp.json())["error"]["message"]
    resp = await client.post("/v1/load_lora_adapter", json={"lora_name": "x",
                                                            "lora_path": str(tmp_path)})
    assert resp.status == 400 and "not a LoRA adapter" in (await resp.json())["error"]["message"]
    resp = await client.post("/v1/completions", json=body(model="pol"))
    assert resp.status == 400  # no adapter of that name yet
    for version in (1, 2):
        resp = await client.post("/v1/load_lora_adapter", json={
            "lora_name": "pol", "lora_path": str(tmp_path / f"v{version}"),
            "load_inplace": True})
        assert resp.status == 200, await resp.text()
        resp = await client.post("/update_weight_version", json={"new_version": str(version)})
        assert resp.status == 200, await resp.text()
        served = backend.model.state_dict()[f"{name}.weight"]
        assert torch.allclose(served, base + version * (b @ a), atol=1e-6)
    resp = await client.post("/v1/completions", json=body(model="pol"))
    assert resp.status == 200  # requests may name the adapter
