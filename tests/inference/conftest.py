"""Fixtures of the inference tests: fake servers and backends over them."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import TestServer

from sao_gym.inference.vllm_server import VLLMServerBackend
from tests.inference.fake_server import Fake


@pytest.fixture
async def serve():
    """``await serve(*fakes)`` starts each fake on 127.0.0.1; all stop at the end."""
    servers: list[TestServer] = []

    async def start(*fakes: Fake) -> list[Fake]:
        for f in fakes:
            srv = TestServer(f.app(), host="127.0.0.1")
            await srv.start_server()
            servers.append(srv)
            f.url = str(srv.make_url("")).rstrip("/")
        return list(fakes)

    yield start
    for srv in servers:
        await srv.close()


@pytest.fixture
async def make_backend(tmp_path):
    made: list[VLLMServerBackend] = []

    def make(fakes, **kw):
        kw = {"retries": 2, "backoff_s": 0.01, "read_timeout_s": 5, "connect_timeout_s": 2,
              "request_timeout_s": 10, "sync_dir": tmp_path / "sync", **kw}
        b = VLLMServerBackend([f.url for f in fakes], **kw)
        made.append(b)
        return b

    yield make
    for b in made:
        await b.aclose()
