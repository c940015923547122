from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from sao_gym.inference import BackendClosed, InferenceBackend, ScriptedBackend, ScriptExhausted
from sao_gym.types import Generation, SamplingParams

P = SamplingParams(max_new_tokens=8, stop_token_ids=(2,))


async def test_replays_generations_and_token_lists_in_order():
    g = Generation(
        token_ids=[5, 6], logprobs=[-0.5, -0.25], finish_reason="stop", policy_versions=[3, 3]
    )
    backend = ScriptedBackend([g, [7, 8, 2], [9, 10]], logprob=-1.5, policy_version=4)
    assert isinstance(backend, InferenceBackend)
    assert backend.remaining == 3
    assert await backend.generate([1, 2], P) is g
    second = await backend.generate((1, 2, 3), P)
    assert second == Generation([7, 8, 2], [-1.5] * 3, "stop", [4, 4, 4])
    third = await backend.generate([4], SamplingParams(max_new_tokens=1))
    assert third == Generation([9], [-1.5], "length", [4])  # cut to max_new_tokens
    assert [c.prompt_ids for c in backend.calls] == [[1, 2], [1, 2, 3], [4]]
    assert backend.calls[0].params is P
    assert backend.remaining == 0
    with pytest.raises(ScriptExhausted, match="ran out of outputs after 3"):
        await backend.generate([1], P)


async def test_sync_and_async_handlers():
    def sync_handler(prompt, params):
        return [len(prompt), 2]

    async def async_handler(prompt, params):
        await asyncio.sleep(0)
        return Generation([prompt[-1]], [-0.1], "length", [0])

    a = ScriptedBackend(sync_handler)
    assert (await a.generate([1, 1, 1], P)).token_ids == [3, 2]
    assert (await a.generate([1], P)).finish_reason == "stop"
    b = ScriptedBackend(async_handler)
    assert (await b.generate([4, 9], P)).token_ids == [9]
    assert len(b.calls) == 1


async def test_handler_errors_propagate_and_bad_outputs_are_rejected():
    def boom(prompt, params):
        raise RuntimeError("backend down")

    with pytest.raises(RuntimeError, match="backend down"):
        await ScriptedBackend(boom).generate([1], P)
    with pytest.raises(TypeError, match="Generation or a list of token ids"):
        await ScriptedBackend(["not tokens"]).generate([1], P)


async def test_update_weights_and_close():
    backend = ScriptedBackend([[1], [2]])
    await backend.update_weights({"w": 0}, version=5)
    await backend.update_weights("/some/dir", version=6)
    assert backend.weight_updates == [5, 6] and backend.policy_version == 6
    assert (await backend.generate([0], P)).policy_versions == [6]
    await backend.aclose()
    await backend.aclose()
    with pytest.raises(BackendClosed):
        await backend.generate([0], P)
    with pytest.raises(BackendClosed):
        await backend.update_weights({}, version=7)


def test_importing_inference_does_not_import_torch():
    code = (
        "import sys, sao_gym.inference as i; assert i.ScriptedBackend; "
        "print('torch' in sys.modules); i.HFBackend; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]
