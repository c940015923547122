"""VLLMServerBackend replacing a dead server (``replace``), against fake servers.

``replace`` is what :class:`~sao_gym.inference.launch.LocalServers` provides
for servers it launched; here it starts another fake server. The real thing
(``sao-gym serve`` processes killed during training) is in test_served.py and
tests/runtime/place/test_ray.py.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from sao_gym.inference.router import NoServersAvailable
from sao_gym.types import SamplingParams
from tests.inference.fake_server import Fake

P = SamplingParams(max_new_tokens=8, stop_token_ids=(2,))


class Replacer:
    """``replace(url)`` for the backend: starts ``fakes`` one by one (from its thread)."""

    def __init__(self, serve, *fakes: Fake, fail: bool = False):
        self.serve, self.fakes, self.fail = serve, list(fakes), fail
        self.replaced: list[str] = []
        self.loop = asyncio.get_running_loop()

    def __call__(self, url: str) -> str:
        self.replaced.append(url)
        if self.fail:
            raise RuntimeError("no room for another server")
        fake = self.fakes.pop(0)
        asyncio.run_coroutine_threadsafe(self.serve(fake), self.loop).result(10)
        return fake.url


def paths(fake: Fake) -> list[str]:
    return [p for p, _ in fake.calls]


async def test_the_last_server_dying_mid_stream_is_replaced_and_the_request_waits(
        serve, make_backend, caplog):
    caplog.set_level(logging.WARNING, logger="sao_gym.inference.vllm_server")
    dying, = await serve(Fake(completions="drop"))
    new = Fake()
    replacer = Replacer(serve, new)
    backend = make_backend([dying], retries=1, policy_version=3, replace=replacer)
    g = await asyncio.wait_for(backend.generate([1, 2, 3], P), 10)
    assert g.token_ids == [11, 12, 13] and g.policy_versions == [3, 3, 3]
    assert replacer.replaced == [dying.url]
    assert paths(new) == ["/v1/models", "/server_info", "/update_weight_version",
                          "/v1/completions"]
    assert new.calls[2][1] == {"new_version": "3"}
    old, fresh = backend.router.servers
    assert not old.alive and fresh.alive and fresh.url == new.url and fresh.version == 3
    assert f"inference server {dying.url} replaced by {new.url} (policy version 3)" in caplog.text


async def test_a_replacement_loads_the_newest_weights_before_taking_requests(
        serve, make_backend, tmp_path):
    a, b = await serve(Fake(), Fake())
    new = Fake()
    backend = make_backend([a, b], retries=0, replace=Replacer(serve, new))
    await backend.update_weights(str(tmp_path / "w5"), 5)
    b.completions = "500"  # b dies; a carries on while b is replaced
    for _ in range(4):
        await backend.generate([1], P)
    while backend._replacing:
        await asyncio.sleep(0.01)
    start = ["/v1/models", "/server_info", "/update_weight_version"]
    update = ["/pause", "/collective_rpc", "/update_weight_version", "/resume"]
    assert paths(new)[:7] == start + update
    assert new.calls[4][1]["kwargs"]["weights_path"] == str(tmp_path / "w5")
    assert new.calls[5][1] == {"new_version": "5"}
    assert [s.alive for s in backend.router.servers] == [True, False, True]
    assert backend.router.servers[2].version == 5
    # the replacement takes its share of later requests
    for _ in range(4):
        await backend.generate([1], P)
    assert new.count("/v1/completions") >= 1


async def test_an_update_during_the_replacements_reload_is_loaded_too(serve, make_backend,
                                                                     tmp_path):
    a, = await serve(Fake())
    new = Fake()
    new.hold_reload = asyncio.Event()
    backend = make_backend([a], retries=0, replace=Replacer(serve, new))
    await backend.update_weights(str(tmp_path / "w1"), 1)
    a.completions = "500"
    gen = asyncio.ensure_future(backend.generate([1], P))  # takes a out, waits for `new`
    await asyncio.wait_for(new.reloading.wait(), 10)  # `new` is loading w1 ...
    await backend.update_weights(str(tmp_path / "w2"), 2)  # ... when w2 is published
    assert backend.policy_version == 2 and not gen.done()
    new.hold_reload.set()
    g = await asyncio.wait_for(gen, 10)
    reloads = [body["kwargs"]["weights_path"] for p, body in new.calls if p == "/collective_rpc"]
    assert reloads == [str(tmp_path / "w1"), str(tmp_path / "w2")]
    assert g.policy_versions == [2, 2, 2]
    assert backend.router.alive[0].version == 2


async def test_a_replacement_that_cannot_start_leaves_the_server_out(serve, make_backend,
                                                                     caplog):
    caplog.set_level(logging.ERROR, logger="sao_gym.inference.vllm_server")
    a, = await serve(Fake(completions="500"))
    replacer = Replacer(serve, fail=True)
    backend = make_backend([a], retries=0, replace=replacer)
    with pytest.raises(NoServersAvailable, match="HTTP 500"):
        await asyncio.wait_for(backend.generate([1], P), 10)
    assert replacer.replaced == [a.url]
    assert "could not be replaced: RuntimeError: no room for another server" in caplog.text
    with pytest.raises(NoServersAvailable):
        await backend.update_weights("/w", 1)


async def test_a_closed_backend_replaces_nothing(serve, make_backend):
    a, = await serve(Fake())
    replacer = Replacer(serve, Fake())
    backend = make_backend([a], replace=replacer)
    await backend.start()
    await backend.aclose()
    backend._take_out(backend.router.servers[0], "gone")
    assert not backend._replacing and replacer.replaced == []
