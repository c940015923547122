"""OpenEnv, one way: sao_gym envs served with OpenEnv's create_app, used by OpenEnv's own client.

Real openenv-core, real uvicorn servers on 127.0.0.1 (threads of this process; the
``arithmetic``/``heavytail`` fixtures are in conftest.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.request

import pytest

pytest.importorskip("openenv")

from openenv.core.env_server.mcp_types import CallToolAction, ListToolsAction  # noqa: E402
from openenv.core.generic_client import GenericEnvClient  # noqa: E402

from sao_gym.adapters.openenv import (  # noqa: E402
    OpenEnvAgentEnv,
    OpenEnvError,
    SaoGymAction,
    SaoGymOpenEnv,
)
from sao_gym.agents.tool_parser import parse_tool_calls  # noqa: E402
from sao_gym.envs.arithmetic.oracle import arithmetic_oracle  # noqa: E402
from tests.adapters.openenv_helpers import (  # noqa: E402
    ENV_ID,
    native_start,
    served,
    tool_schema,
)


# ----- a sao_gym env served to OpenEnv's own client -----
async def test_generic_client_gets_the_task_of_the_seed(arithmetic):
    native, info, _ = await native_start(ENV_ID, 3)
    other, _, _ = await native_start(ENV_ID, 4)
    assert native != other
    client = GenericEnvClient(base_url=arithmetic.url)
    try:
        first = await client.reset(seed=3)
        again = await client.reset(seed=3)
        another = await client.reset(seed=4)
    finally:
        await client.close()
    assert first.observation["messages"] == again.observation["messages"] == native
    assert another.observation["messages"] == other
    assert [m["role"] for m in native] == ["system", "user"]
    assert [tool_schema(t) for t in first.observation["tools"]] == info["tools"]
    assert first.observation["task_id"] == first.observation["info"]["task_id"]
    assert first.done is False and first.reward is None


async def test_list_tools_is_exactly_the_envs_tools(arithmetic):
    _, info, _ = await native_start(ENV_ID, 0)
    client = GenericEnvClient(base_url=arithmetic.url)
    try:
        before_reset = await client.step(ListToolsAction())
        await client.reset(seed=0)
        listed = await client.step(ListToolsAction())
    finally:
        await client.close()
    for result in (before_reset, listed):
        tools = result.observation["tools"]
        assert [tool_schema(t) for t in tools] == info["tools"]
        assert tools[1]["input_schema"]["properties"]["answer"]["type"] == ["string", "number"]
        assert result.done is False


async def _solve(client, seed, correct):
    first = await client.reset(seed=seed)
    tools = [tool_schema(t) for t in first.observation["tools"]]
    _, _, task = await native_start(ENV_ID, seed)
    messages = list(first.observation["messages"])
    rewards = []
    while True:
        [tool_call] = parse_tool_calls(arithmetic_oracle(messages, task), tools)[1]
        name = tool_call["function"]["name"]
        args = json.loads(tool_call["function"]["arguments"])
        if name == "submit" and not correct:
            args = {"answer": str(int(task["answer"]) + 1)}
        result = await client.step(CallToolAction(tool_name=name, arguments=args))
        rewards.append(result.reward)
        messages += result.observation["messages"]
        if result.done:
            return rewards, result


async def test_oracle_submission_is_rewarded_and_ends_the_episode(arithmetic):
    client = GenericEnvClient(base_url=arithmetic.url)
    try:
        rewards, last = await _solve(client, 7, correct=True)
        assert rewards == [0.0, 1.0]
        assert last.observation["result"] == "Correct." and last.observation["terminated"]
        assert not last.observation["truncated"] and last.observation["stop_reason"] == "terminated"
        rewards, last = await _solve(client, 8, correct=False)
        assert rewards == [0.0, 0.0] and last.done
        assert last.observation["result"] == "Incorrect." and last.observation["terminated"]
        state = await client.state()
        assert state["step_count"] == 2 and state["done"] and state["reward"] == 0.0
    finally:
        await client.close()


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records = []

    def emit(self, record):
        self.records.append(record)


async def test_sixteen_concurrent_sessions_keep_their_own_episodes(arithmetic):
    errors = Records()  # e.g. "Exception in ASGI application" when a client closes
    logging.getLogger("uvicorn.error").addHandler(errors)

    async def one(seed):
        client = GenericEnvClient(base_url=arithmetic.url)
        try:
            rewards, last = await _solve(client, seed, correct=seed % 2 == 0)
            return sum(rewards), last.observation["terminated"]
        finally:
            await client.close()

    try:
        results = await asyncio.wait_for(asyncio.gather(*(one(s) for s in range(100, 116))), 60)
        await asyncio.sleep(0.2)  # the sessions' ends
    finally:
        logging.getLogger("uvicorn.error").removeHandler(errors)
    assert results == [(1.0 if s % 2 == 0 else 0.0, True) for s in range(100, 116)]
    assert [r.getMessage() for r in errors.records] == []


async def test_a_full_server_says_so():
    with served(ENV_ID, max_concurrent_envs=1) as server:
        first, second = OpenEnvAgentEnv(server.url), OpenEnvAgentEnv(server.url)
        try:
            await first.areset(seed=0)
            with pytest.raises(OpenEnvError, match="CAPACITY_REACHED"):
                await second.areset(seed=0)
            await first.aclose()
            await asyncio.sleep(0.2)  # the server ends the first session
            obs, _ = await second.areset(seed=0)  # reconnects
            assert obs[-1]["role"] == "user"
        finally:
            await first.aclose()
            await second.aclose()


def test_the_http_routes_reset_a_fresh_env_per_request(arithmetic):
    native = asyncio.run(native_start(ENV_ID, 3))[0]
    request = urllib.request.Request(f"{arithmetic.url}/reset", data=json.dumps(
        {"seed": 3}).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        body = json.loads(response.read())
    assert body["observation"]["messages"] == native and body["done"] is False
    with urllib.request.urlopen(f"{arithmetic.url}/schema", timeout=10) as response:
        schema = json.loads(response.read())
    assert set(schema["action"]["properties"]) >= {"type", "tool_name", "arguments", "content"}


async def test_bad_tool_calls_are_error_texts_not_server_errors(arithmetic):
    client = GenericEnvClient(base_url=arithmetic.url)
    try:
        await client.reset(seed=1)
        unknown = await client.step({"type": "call_tool", "tool_name": "nope", "arguments": {}})
        wrong = await client.step(CallToolAction(tool_name="calculator",
                                                 arguments={"expression": 5}))
        missing = await client.step(CallToolAction(tool_name="submit", arguments={}))
        broken = await client.step({"type": "call_tool", "tool_name": "calculator",
                                    "arguments": '{"expression": '})
        text = await client.step({"type": "message", "content": "the answer is 4"})
        with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):  # not an action at all
            await client.step({"type": "call_tool"})
        still = await client.step(CallToolAction(tool_name="calculator",
                                                 arguments={"expression": "6*7"}))
    finally:
        await client.close()
    assert unknown.observation["result"] == "Error: unknown tool 'nope'. Tools: calculator, submit."
    assert wrong.observation["result"] == (
        "Error: calculator: argument 'expression' must be of type string, got int")
    assert missing.observation["result"] == "Error: submit: missing required argument(s): answer"
    assert broken.observation["result"].startswith("Error: calculator: arguments are not valid")
    assert text.observation["text"].startswith("Error: no tool call found")
    for result in (unknown, wrong, missing, broken, text):
        assert result.reward == 0.0 and result.done is False
        assert result.observation.get("error") is None
    assert still.observation["result"] == "42"  # the session survived all of it


async def test_environment_works_in_process_inside_a_running_loop():
    native, info, _ = await native_start(ENV_ID, 5)
    env = SaoGymOpenEnv(ENV_ID, max_episode_steps=2)
    try:
        assert [t["function"]["name"] for t in env.tools()] == ["calculator", "submit"]
        first = env.reset(seed=5)  # the sync API, from a coroutine
        assert first.messages == first.metadata["messages"] == native
        assert first.metadata["tools"] == info["tools"]
        step = env.step(CallToolAction(tool_name="calculator", arguments={"expression": "1+1"}))
        assert (step.result, step.reward, step.done, step.truncated) == ("2", 0.0, False, False)
        step = await env.step_async(SaoGymAction(type="call_tool", tool_name="calculator",
                                                 arguments={"expression": "2"}))
        assert step.done and step.truncated and not step.terminated
        assert step.stop_reason == "max_turns" and step.metadata["truncated"]
        listed = await env.step_async(ListToolsAction())
        assert [t.name for t in listed.tools] == ["calculator", "submit"]
        state = env.state
        assert (state.step_count, state.truncated, state.stop_reason) == (2, True, "max_turns")
        after = env.step("one more")
        assert after.done and after.text.startswith("Error: the episode is over")
    finally:
        env.close()


async def test_an_env_that_raises_is_an_infra_failure_observation():
    env = SaoGymOpenEnv("tests/OpenEnvCounter-v0")
    try:
        await env.reset_async(seed=0)
        crashed = await env.step_async(CallToolAction(tool_name="crash"))
    finally:
        env.close()
    assert crashed.done and crashed.infra_failure and crashed.stop_reason == "env_error"
    assert crashed.error is not None and "OSError: sandbox died" in crashed.error.message
