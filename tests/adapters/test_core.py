"""The adapters' shared core: the background loop, EnvSession and schema -> callable."""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from typing import Any, Union

import pytest

from sao_gym.adapters.callables import comparable, python_type, tool_function
from sao_gym.adapters.loop import BackgroundLoop, shared_loop
from sao_gym.adapters.session import EPISODE_OVER, EnvSession
from sao_gym.types import StopReason

# ---------- BackgroundLoop ----------


def test_run_from_a_thread_and_from_inside_a_running_loop():
    loop = BackgroundLoop()

    async def where():
        await asyncio.sleep(0)
        return threading.current_thread().name

    assert loop.run(where()) == "sao-gym-adapters"

    async def handler():  # an async request handler calling a sync API, as OpenEnv's server does
        return loop.run(where())

    assert asyncio.run(handler()) == "sao-gym-adapters"

    async def awaiting():
        return await loop.arun(where())

    assert asyncio.run(awaiting()) == "sao-gym-adapters"
    loop.close()
    assert not loop.running
    with pytest.raises(RuntimeError, match="closed"):
        loop.run(where())


def test_run_times_out_and_cancels():
    loop = BackgroundLoop()
    cancelled = threading.Event()

    async def slow():
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    start = time.monotonic()
    with pytest.raises(TimeoutError):
        loop.run(slow(), timeout=0.2)
    assert time.monotonic() - start < 5
    assert cancelled.wait(5)
    loop.close()


def test_run_on_its_own_thread_is_refused_not_a_deadlock():
    loop = BackgroundLoop()

    async def inner():
        return 1

    async def outer():
        with pytest.raises(RuntimeError, match="its own loop"):
            loop.run(inner())
        return await loop.arun(inner())  # awaiting is fine there

    assert loop.run(outer()) == 1
    loop.close()


def test_close_awaits_the_exit_callbacks():
    loop = BackgroundLoop()
    closed = []

    async def close_env():
        await asyncio.sleep(0.01)
        closed.append(True)

    loop.at_exit(1, close_env)
    loop.at_exit(2, close_env)
    loop.at_exit(2, None)
    loop.close()
    assert closed == [True]


def test_shared_loop_is_one_instance():
    assert shared_loop() is shared_loop()


# ---------- EnvSession ----------


def test_session_keeps_the_episode_record():
    s = EnvSession("sao_gym/Arithmetic-v0")
    obs, info = s.reset(seed=5)
    assert obs[-1]["role"] == "user" and [t["function"]["name"] for t in s.tools] == \
        ["calculator", "submit"]
    task = s.env.unwrapped.task
    out = s.call_tool("calculator", {"expression": task["expression"]})
    assert out.text == task["answer"] and not out.done
    out = s.call_tool("submit", {"answer": task["answer"]})
    assert (out.reward, out.terminated, out.done) == (1.0, True, True)
    assert (s.reward, s.terminated, s.truncated, s.stop_reason) == \
        (1.0, True, False, StopReason.TERMINATED)
    assert s.call_tool("submit", {"answer": "0"}).text == EPISODE_OVER
    assert s.reward == 1.0  # nothing ran after the end
    s.reset(seed=6)  # reused for the next episode
    assert (s.reward, s.done, s.stop_reason) == (0.0, False, None)
    s.close()
    s.close()


def test_session_truncation_and_arguments_as_json_text():
    s = EnvSession("sao_gym/Arithmetic-v0", max_episode_steps=2)
    s.reset(seed=0)
    assert s.call_tool("calculator", '{"expression": "1+1"}').text == "2"
    out = s.call_tool("calculator", {"expression": "2+2"})
    assert out.truncated and s.truncated and not s.terminated
    assert s.stop_reason == StopReason.MAX_TURNS  # the TurnLimit wrapper says which limit
    s.close()


def test_session_sync_calls_from_inside_a_running_loop():
    s = EnvSession("sao_gym/Arithmetic-v0")

    async def handler():
        s.reset(seed=1)
        return s.call_tool("calculator", {"expression": "6*7"}).text

    assert asyncio.run(handler()) == "42"
    s.close()


def test_session_env_failure_is_an_infra_failure_not_a_raise():
    s = EnvSession("sao_gym/Arithmetic-v0")
    s.reset(seed=0)

    async def broken(action):
        raise ConnectionError("gone")

    s.env.astep = broken
    out = s.call_tool("calculator", {"expression": "1"})
    assert "gone" in out.text and out.info["infra_failure"]
    assert s.infra_failure and s.stop_reason == StopReason.ENV_ERROR and s.done
    s.close()


def test_session_step_timeout():
    s = EnvSession("sao_gym/HeavyTail-v0", latency_median_s=5.0, latency_sigma=0.0)
    s.reset(seed=0)
    start = time.monotonic()
    out = s.send("hello", timeout=0.2)
    assert time.monotonic() - start < 3
    assert "timed out" in out.text and s.infra_failure
    s.close()


def test_session_needs_exactly_one_source():
    with pytest.raises(ValueError, match="exactly one"):
        EnvSession()
    with pytest.raises(ValueError, match="exactly one"):
        EnvSession("sao_gym/Arithmetic-v0", make_env=lambda: None)


# ---------- tool_function ----------


def test_python_types_of_json_types():
    assert python_type({"type": "string"}) is str
    assert python_type({"type": "integer"}) is int
    assert python_type({"type": "number"}) is float
    assert python_type({"type": "boolean"}) is bool
    assert python_type({}) is Any
    assert python_type({"type": "array", "items": {"type": "integer"}}) == list[int]
    assert python_type({"type": "array"}) is list
    assert python_type({"type": "object"}) is dict
    assert python_type({"type": ["string", "number"]}) == Union[str, float]  # noqa: UP007
    assert python_type({"type": ["string", "null"]}) == (str | None)


HOSTILE = {"type": "function", "function": {
    "name": "search", "description": "Search the index.\nReturns the best hits: a list.",
    "parameters": {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "what to look for,\n  on two lines"},
            "mode": {"type": "string", "enum": ["fast", "exact"], "description": "how"},
            "limit": {"type": "integer", "description": "at most this many: e.g. 10"},
            "tags": {"type": "array", "items": {"type": "string"}, "description": "filters"},
            "cursor": {"type": ["string", "null"], "description": "where to go on"},
        },
        "required": ["query", "mode"],
        "additionalProperties": False,
    }}}


def test_transformers_reads_back_the_schema():
    from transformers.utils import get_json_schema

    fn = tool_function(HOSTILE, lambda name, args: (name, args))
    got = get_json_schema(fn)
    expected = comparable(HOSTILE)
    # newlines in descriptions collapse to spaces: that is all that changes
    expected["function"]["description"] = "Search the index. Returns the best hits: a list."
    expected["function"]["parameters"]["properties"]["query"]["description"] = \
        "what to look for, on two lines"
    assert comparable(got) == expected


def test_calls_forward_given_arguments_only():
    seen = []
    fn = tool_function(HOSTILE, lambda name, args: seen.append((name, args)) or "ok")
    assert fn(query="x", mode="fast") == "ok"
    assert fn(query="x", mode="fast", cursor=None, limit=None, bogus=1) == "ok"
    assert seen == [("search", {"query": "x", "mode": "fast"}),
                    ("search", {"query": "x", "mode": "fast", "cursor": None, "bogus": 1})]
    sig = inspect.signature(fn)
    assert [p for p, v in sig.parameters.items() if v.default is inspect.Parameter.empty] == \
        ["query", "mode"]


def test_method_form_takes_self():
    class Holder:
        pass

    Holder.search = tool_function(HOSTILE, lambda self, name, args: (self, name, args),
                                  method=True)
    h = Holder()
    assert h.search(query="q", mode="exact") == (h, "search", {"query": "q", "mode": "exact"})
    assert list(inspect.signature(h.search).parameters)[:2] == ["query", "mode"]


@pytest.mark.parametrize("bad", ["from", "a-b", "1x"])
def test_argument_names_python_cannot_take_are_refused(bad):
    schema = {"name": "t", "parameters": {"type": "object", "properties": {bad: {}}}}
    with pytest.raises(ValueError, match="not a Python parameter name"):
        tool_function(schema, lambda n, a: None)


def test_not_a_tool_schema_is_refused():
    with pytest.raises(ValueError, match="not a function tool schema"):
        tool_function({"type": "function"}, lambda n, a: None)
    with pytest.raises(ValueError, match="JSON object schema"):
        tool_function({"name": "t", "parameters": {"type": "array"}}, lambda n, a: None)
