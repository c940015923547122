"""OpenEnv, the other way: OpenEnv servers as sao_gym envs (``sao_gym/OpenEnv-v0``).

Against our own served envs (natively compared), a foreign FastMCP OpenEnv env, dead, silent
and slow servers, and `sao-gym train` on `sao-gym serve-env` in a subprocess.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("openenv")

from openenv.core.env_server.mcp_types import CallToolAction  # noqa: E402

import sao_gym  # noqa: E402
from sao_gym.adapters import openenv as adapter  # noqa: E402
from sao_gym.adapters.openenv import (  # noqa: E402
    OpenEnvAgentEnv,
    OpenEnvError,
    create_app,
)
from sao_gym.agents import ScriptedAgent  # noqa: E402
from sao_gym.agents.tool_parser import parse_tool_calls  # noqa: E402
from sao_gym.cli import main  # noqa: E402
from sao_gym.envs.arithmetic.oracle import arithmetic_oracle  # noqa: E402
from sao_gym.logging import read_metrics  # noqa: E402
from sao_gym.types import StopReason  # noqa: E402
from sao_gym.utils.env_checker import CHECKS, check_agent_env  # noqa: E402
from tests.adapters.openenv_helpers import (  # noqa: E402
    ENV_ID,
    FAST_HEAVY,
    HEAVY,
    LiveServer,
    free_port,
    native_start,
    served,
)
from tests.helpers import call, calls_msg  # noqa: E402


# ----- an OpenEnv server as a sao_gym env -----
def test_openenv_agent_env_passes_the_checker(arithmetic, heavytail):
    for server in (arithmetic, heavytail):
        env = sao_gym.make("sao_gym/OpenEnv-v0", base_url=server.url, step_timeout_s=30)
        assert check_agent_env(env) == list(CHECKS)


def oracle_agent(task, tools, oracle):
    def policy(messages):
        content, calls = parse_tool_calls(oracle(messages, task), tools)
        return {"role": "assistant", "content": content or None, "tool_calls": calls}
    return ScriptedAgent(policy)


def summary(rollout):
    return (rollout.reward, rollout.terminated, rollout.truncated, rollout.stop_reason,
            rollout.infra_failure, rollout.task_id, rollout.metrics["turns"], rollout.messages)


async def _compare_arithmetic(url, seeds, oracle, **make_kwargs):
    native, remote = [], []
    for seed in seeds:
        _, info, task = await native_start(ENV_ID, seed)
        for env, out in ((sao_gym.make(ENV_ID, **make_kwargs), native),
                         (sao_gym.make("sao_gym/OpenEnv-v0", base_url=url, **make_kwargs),
                          remote)):
            try:
                out.append(await sao_gym.run_episode(
                    env, oracle_agent(task, info["tools"], oracle), seed=seed))
            finally:
                await env.aclose()
    return native, remote


async def test_rewards_match_the_native_env_on_20_seeds(arithmetic):
    oracle = functools.partial(arithmetic_oracle, slip_rate=0.3)
    native, remote = await _compare_arithmetic(arithmetic.url, range(20), oracle)
    assert [summary(r) for r in remote] == [summary(r) for r in native]
    assert {r.reward for r in native} == {0.0, 1.0}  # the slips make rewards vary
    assert all(r.terminated and not r.truncated for r in remote)


async def test_truncation_travels_as_truncation():
    # the client's turn limit, and the server's (its stop reason comes back)
    with served(ENV_ID, max_episode_steps=1) as server:
        native, remote = await _compare_arithmetic(server.url, [0, 1], arithmetic_oracle,
                                                   max_episode_steps=1)
    assert [summary(r) for r in remote] == [summary(r) for r in native]
    assert all(r.truncated and r.stop_reason is StopReason.MAX_TURNS for r in remote)
    with served(ENV_ID, max_episode_steps=1) as server:
        env = OpenEnvAgentEnv(server.url)
        await env.areset(seed=0)
        obs, reward, terminated, truncated, info = await env.astep(
            calls_msg(call("calculator", {"expression": "1"}, id="mine")))
        await env.aclose()
    assert (terminated, truncated, info["stop_reason"]) == (False, True, "max_turns")
    assert obs[0]["tool_call_id"] == "mine" and obs[0]["content"] == "1"


async def test_heavytail_text_env_matches_natively(heavytail):
    def policy(messages):
        return "x" * (len(messages) % 3 + 1)

    for seed in range(4):
        native_env = sao_gym.make(HEAVY, **FAST_HEAVY)
        remote_env = sao_gym.make("sao_gym/OpenEnv-v0", base_url=heavytail.url,
                                  max_episode_steps=16)
        try:
            native = await sao_gym.run_episode(native_env, ScriptedAgent(policy), seed=seed)
            remote = await sao_gym.run_episode(remote_env, ScriptedAgent(policy), seed=seed)
        finally:
            await native_env.aclose()
            await remote_env.aclose()
        assert summary(remote) == summary(native)
        assert remote.terminated and remote.metrics["turns"] >= 1


async def test_several_calls_in_a_message_are_several_server_steps(arithmetic):
    env = OpenEnvAgentEnv(arithmetic.url)
    try:
        await env.areset(seed=2)
        obs, reward, terminated, _, _ = await env.astep(calls_msg(
            call("calculator", {"expression": "2+2"}, id="a"), call("nope", {}, id="b"),
            call("calculator", '{"expression": ', id="c"),
            call("submit", {"answer": "x"}, id="d"), call("calculator", {}, id="e")))
        state = await env.server_state()
    finally:
        await env.aclose()
    assert [m["tool_call_id"] for m in obs] == ["a", "b", "c", "d"]  # a submission ends the turn
    assert [m["content"] for m in obs][:2] == ["4", "Error: unknown tool 'nope'. Tools: "
                                               "calculator, submit."]
    assert obs[2]["content"].startswith("Error: calculator: arguments are not valid JSON")
    assert obs[3]["content"] == "Incorrect." and terminated and reward == 0.0
    assert state["step_count"] == 3  # the broken JSON was answered here, without a step


async def test_reset_options_reach_the_servers_env(arithmetic):
    env = OpenEnvAgentEnv(arithmetic.url)
    try:
        obs, info = await env.areset(options={"task": {"expression": "2 + 3"}})
        assert obs[-1]["content"] == "What is 2 + 3?" and env.task == {"id": "arithmetic:2+3"}
        with pytest.raises(OpenEnvError, match='answered: .*options\\["task"\\] must be a dict'):
            await env.areset(options={"task": 7})
        obs, _ = await env.areset(seed=0)  # the same connection goes on
        assert obs == (await native_start(ENV_ID, 0))[0]
        with pytest.raises(ValueError, match="JSON-serialisable"):
            await env.areset(options={"task": object()})
    finally:
        await env.aclose()


async def test_an_env_failure_on_the_server_is_an_infra_failure_here():
    with served("tests/OpenEnvCounter-v0") as server:
        env = sao_gym.make("sao_gym/OpenEnv-v0", base_url=server.url)
        try:
            rollout = await sao_gym.run_episode(env, ScriptedAgent([calls_msg(call("crash"))]),
                                                seed=0)
        finally:
            await env.aclose()
    assert rollout.infra_failure and rollout.stop_reason is StopReason.ENV_ERROR
    assert not rollout.terminated and "sandbox died" in rollout.messages[-1]["content"]


def guess_env_class():
    """An OpenEnv MCP environment of OpenEnv's own kind (FastMCP tools, no sao_gym)."""
    from fastmcp import FastMCP
    from openenv.core.env_server.mcp_environment import MCPEnvironment
    from openenv.core.env_server.types import Observation, State

    class PromptObservation(Observation):
        prompt: str = ""

    class GuessEnv(MCPEnvironment):
        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self):
            mcp = FastMCP("guess")

            @mcp.tool
            def guess(n: int) -> str:
                """Guess the secret number."""
                return "right" if n == 3 else "wrong"

            super().__init__(mcp)

        def reset(self, seed=None, episode_id=None, **kwargs):
            return PromptObservation(prompt="Guess a number from 0 to 9.")

        def _step_impl(self, action, timeout_s=None, **kwargs):
            return Observation()

        async def step_async(self, action, timeout_s=None, **kwargs):
            obs = await super().step_async(action, timeout_s=timeout_s, **kwargs)
            if isinstance(action, CallToolAction) and obs.error is None:
                obs.done, obs.reward = True, float(action.arguments.get("n") == 3)
            return obs

        @property
        def state(self):
            return State()

    return GuessEnv


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
async def test_a_foreign_mcp_server_through_list_tools_and_call_tool():
    from openenv.core.env_server.http_server import create_app as openenv_create_app
    from openenv.core.env_server.mcp_types import CallToolObservation

    server = LiveServer(openenv_create_app(guess_env_class(), CallToolAction,
                                           CallToolObservation, max_concurrent_envs=2))
    env = sao_gym.make("sao_gym/OpenEnv-v0", base_url=server.url)
    try:
        obs, info = await env.areset(seed=0)
        text = await env.astep("I think 3")  # the server takes tool calls only
        bad = await env.astep(calls_msg(call("guess", {"n": "x"})))
        last = await env.astep(calls_msg(call("guess", {"n": 3}, id="g")))
    finally:
        await env.aclose()
        server.stop()
    assert obs == [{"role": "user", "content": "Guess a number from 0 to 9."}]
    assert info["tools"] == [{"type": "function", "function": {
        "name": "guess", "description": "Guess the secret number.",
        "parameters": {"type": "object", "additionalProperties": False,
                       "properties": {"n": {"type": "integer"}}, "required": ["n"]}}}]
    assert text[0] == [{"role": "user", "content": "Error: no tool call found. Call one of the "
                        "tools: guess."}] and text[1:4] == (0.0, False, False)
    assert bad[0][0]["content"].startswith("Error:") and "valid integer" in bad[0][0]["content"]
    assert bad[1:4] == (0.0, False, False)
    assert last[0] == [{"role": "tool", "tool_call_id": "g", "name": "guess", "content": "right"}]
    assert last[1:4] == (1.0, True, False)  # `done` counts as terminated


# ----- a dead, silent or slow server: clear errors, promptly -----
async def test_a_dead_server_fails_promptly():
    env = OpenEnvAgentEnv(f"http://127.0.0.1:{free_port()}", connect_timeout_s=2)
    start = time.monotonic()
    with pytest.raises(OpenEnvError, match="cannot connect to the OpenEnv server at"):
        await env.areset(seed=0)
    rollout = await sao_gym.run_episode(env, ScriptedAgent(["hi"]), seed=0)
    assert rollout.infra_failure and rollout.stop_reason is StopReason.ENV_ERROR
    assert time.monotonic() - start < 5


async def test_a_silent_server_times_out_on_connect():
    with socket.socket() as silent:  # accepts TCP connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        env = OpenEnvAgentEnv(f"http://127.0.0.1:{silent.getsockname()[1]}",
                              connect_timeout_s=1, step_timeout_s=1)
        start = time.monotonic()
        with pytest.raises(OpenEnvError, match="cannot connect"):
            await env.areset(seed=0)
        assert time.monotonic() - start < 4


async def test_a_slow_step_times_out_and_a_stopped_server_fails_the_next_step():
    with served(HEAVY, latency_median_s=5.0, latency_sigma=0.0, max_latency_s=5.0) as server:
        env = OpenEnvAgentEnv(server.url, step_timeout_s=0.5)
        await env.areset(seed=0)
        start = time.monotonic()
        with pytest.raises(OpenEnvError, match="no answer from .* within 0.5 s"):
            await env.astep("hello")
        assert time.monotonic() - start < 3
        with pytest.raises(OpenEnvError, match="reset to start anew"):  # no silent new session
            await env.astep("again")
        obs, _ = await env.areset(seed=0)  # a reset reconnects
        assert obs == [{"role": "user", "content": "Say anything."}]
    start = time.monotonic()
    with pytest.raises(OpenEnvError):
        await env.astep("the server is gone")
    assert time.monotonic() - start < 5
    await env.aclose()


def test_bad_arguments_are_refused_clearly():
    with pytest.raises(ValueError, match="base_url"):
        OpenEnvAgentEnv("127.0.0.1:8000")
    with pytest.raises(ValueError, match="step_timeout_s"):
        OpenEnvAgentEnv("http://127.0.0.1:8000", step_timeout_s=0)
    with pytest.raises(ValueError, match="cannot make env 'nope/Nothing-v0'"):
        create_app("nope/Nothing-v0")
    with pytest.raises(ValueError, match="bogus"):
        create_app(ENV_ID, bogus=1)


def test_serve_env_cli_refuses_bad_input(capsys):
    assert main(["serve-env", "nope/Nothing-v0"]) == 2
    assert "nope/Nothing-v0" in capsys.readouterr().err
    assert main(["serve-env", ENV_ID, "--env-kwargs", "[1]"]) == 2
    assert "JSON object" in capsys.readouterr().err
    assert main(["serve-env", ENV_ID, "--env-kwargs", '{"bogus": 1}']) == 2
    assert "bogus" in capsys.readouterr().err


@pytest.mark.parametrize("module", ["openenv_client", "openenv"])
def test_without_openenv_the_error_names_the_extra(monkeypatch, module):
    for name in list(sys.modules):
        if name == "openenv" or name.startswith("openenv."):
            monkeypatch.setitem(sys.modules, name, None)
    path = Path(adapter.__file__).with_name(f"{module}.py")
    spec = importlib.util.spec_from_file_location(f"_probe_{module}", path)
    with pytest.raises(ImportError, match=r"pip install 'sao-gym\[openenv\]'"):
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


def test_importing_sao_gym_does_not_import_openenv():
    code = "import sys, sao_gym; sao_gym.make; print('openenv' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.strip() == "False", out.stderr[-2000:]


# ----- training on a served env -----
SMALL = ["--set", "rollout.concurrency=2", "--set", "rollout.max_new_tokens=8",
         "--set", "rollout.max_episode_steps=2", "--set", "rollout.batch_size=2",
         "--set", "learner.critic_warmup_steps=0", "--set", "rollout.max_context_tokens=1024",
         "--set", "inference.max_batch_size=2", "--set", "warm_start=null",
         "--set", "eval.episodes=0"]


@pytest.fixture
def cli_server(tmp_path):
    """`sao-gym serve-env` in a subprocess, stopped whatever happens."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (tmp_path / "server.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "sao_gym.cli", "serve-env", ENV_ID,
                             "--port", str(port), "--env-kwargs", '{"operators": "+"}',
                             "--max-sessions", "8"], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "serve-env did not come up within 120 s"
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.mark.slow
def test_train_three_steps_on_a_served_env(cli_server, tmp_path):
    run = tmp_path / "run"
    assert main(["train", *SMALL, "--set", "env=sao_gym/OpenEnv-v0",
                 "--set", f"env_kwargs={{base_url: '{cli_server}'}}",
                 "--set", "total_steps=3", "--out", str(run)]) == 0
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(math.isfinite(r["rollout/return_mean"]) for r in rows)
    assert all(r["rollout/infra_failures"] == 0 and r["rollout/turns_mean"] >= 1 for r in rows)
