"""What the OpenEnv tests share: live uvicorn servers of our app on 127.0.0.1, native runs.

Imported by the test modules after their ``pytest.importorskip("openenv")``.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import uvicorn

import sao_gym
from sao_gym.adapters import openenv as adapter
from sao_gym.adapters.openenv import create_app
from tests.helpers import CounterEnv

ENV_ID = "sao_gym/Arithmetic-v0"
HEAVY = "sao_gym/HeavyTail-v0"
FAST_HEAVY = {"latency_median_s": 0.002, "latency_sigma": 0.5}
sao_gym.register("tests/OpenEnvCounter-v0", CounterEnv, max_episode_steps=10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    """An app served by uvicorn on a thread of this process."""

    def __init__(self, app):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="warning",
            ws_max_size=adapter.WS_MAX_SIZE, timeout_graceful_shutdown=1))
        self.thread = threading.Thread(target=self.server.run, name="openenv-test-server",
                                       daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert self.thread.is_alive(), "the server thread died"
            assert time.monotonic() < deadline, "the server did not start within 30 s"
            time.sleep(0.02)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(15)
        assert not self.thread.is_alive(), "the server did not stop"


@contextlib.contextmanager
def served(env_id, **kwargs):
    server = LiveServer(create_app(env_id, **kwargs))
    try:
        yield server
    finally:
        server.stop()


async def native_start(env_id, seed, **kwargs):
    env = sao_gym.make(env_id, **kwargs)
    obs, info = await env.areset(seed=seed)
    task = dict(env.unwrapped.task)
    await env.aclose()
    return obs, info, task


def tool_schema(tool):
    return {"type": "function", "function": {"name": tool["name"],
                                             "description": tool["description"],
                                             "parameters": tool["input_schema"]}}
