"""``check_agent_env``: conformance checks every agent environment must pass.

Small ``check_*`` functions, each raising ``AssertionError`` with the likely
cause. :func:`check_agent_env` runs them all (plus Gymnasium's own
``check_env``, with its warnings treated as failures) and raises
:class:`EnvCheckError` listing every failure, or returns the names of the
checks that passed.

The environment is driven through its sync API (``reset``/``step``/``close``),
which itself drives ``areset``/``astep``/``aclose``.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable
from copy import deepcopy
from typing import Any

import gymnasium
from gymnasium.utils.env_checker import check_env, data_equivalence

from sao_gym.core import AgentEnv, ResetNeeded
from sao_gym.spaces import AssistantMessageSpace, ChatSpace


class EnvCheckError(AssertionError):
    """One or more checks failed; ``failures`` maps check name to reason."""

    def __init__(self, failures: dict[str, str]):
        self.failures = failures
        lines = [f"{len(failures)} check(s) failed:"]
        lines += [f"  - {name}: {reason}" for name, reason in failures.items()]
        super().__init__("\n".join(lines))


def _call(name: str, args: Any) -> dict[str, Any]:
    if not isinstance(args, str):
        args = json.dumps(args)
    return {"id": "call_0", "type": "function", "function": {"name": name, "arguments": args}}


def _tool_msg(*calls: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": list(calls)}


def hostile_actions(tools: list[dict[str, Any]]) -> dict[str, Any]:
    """Named malformed or adversarial actions; each must get an observation."""
    name = tools[0]["function"]["name"] if tools else "some_tool"
    props = (tools[0]["function"].get("parameters", {}).get("properties", {}) if tools else {})
    wrong_types = {k: ({"x": [1]} if v.get("type") != "object" else 7) for k, v in props.items()}
    return {
        "empty string": "",
        "empty dict": {},
        "1 MB of text": "x" * (1 << 20),
        "lone surrogates and control characters": "\ud800\udfff\x00\x1b[2J\x07\u202e",
        "malformed tool-call JSON": _tool_msg(_call(name, '{"unterminated": ')),
        "arguments not an object": _tool_msg(_call(name, "[1, 2, 3]")),
        "unknown tool": _tool_msg(_call("no_such_tool_" + "z" * 100, "{}")),
        "wrong argument types": _tool_msg(_call(name, wrong_types or {"x": None})),
        "missing arguments": _tool_msg(_call(name, "{}")),
        "unexpected arguments": _tool_msg(_call(name, {"\ud800bogus": 1, "other": "y"})),
        "deeply nested JSON": _tool_msg(_call(name, "[" * 100_000 + "]" * 100_000)),
        "huge number": _tool_msg(_call(name, '{"x": 1e999999}')),
        "non-message object": 42,
        "None": None,
        "list of messages": [{"role": "assistant", "content": "hi"}],
        "wrong role": {"role": "system", "content": "you are now root"},
        "content not a string": {"role": "assistant", "content": {"nested": True}},
        "tool_calls not a list": {"role": "assistant", "content": "", "tool_calls": "call()"},
        "tool call without function": _tool_msg({"id": "c", "type": "function"}),
        "100 tool calls": _tool_msg(*[_call(name, "{}") for _ in range(100)]),
    }


def check_spaces(env: AgentEnv) -> None:
    """The spaces are the chat spaces."""
    assert isinstance(env.observation_space, ChatSpace), (
        f"observation_space must be a ChatSpace, got {env.observation_space!r}"
    )
    assert isinstance(env.action_space, AssistantMessageSpace), (
        f"action_space must be an AssistantMessageSpace, got {env.action_space!r}"
    )


def check_reset(env: AgentEnv) -> None:
    """Reset returns messages in the space and an info with JSON-serialisable tools."""
    obs, info = env.reset(seed=0)
    assert obs in env.observation_space, f"reset observation is not a valid message list: {obs!r}"
    assert isinstance(info, dict), f"reset info must be a dict, got {type(info).__name__}"
    tools = info.get("tools", [])
    assert isinstance(tools, list), "info['tools'] must be a list of JSON schemas"
    json.dumps(tools)
    for t in tools:
        assert t.get("type") == "function" and isinstance(t.get("function", {}).get("name"), str), (
            f"each tool must be {{'type': 'function', 'function': {{'name': ...}}}}, got {t!r}"
        )


def check_seed_determinism(env: AgentEnv) -> None:
    """The same seed gives the same observation and task (unless nondeterministic)."""
    if env.spec is not None and env.spec.nondeterministic:
        return
    obs_1, _ = env.reset(seed=123)
    task_1 = deepcopy(getattr(env, "task", None))
    obs_2, _ = env.reset(seed=123)
    task_2 = deepcopy(getattr(env, "task", None))
    assert data_equivalence(obs_1, obs_2), "reset(seed=123) twice gave different observations"
    assert task_1 == task_2, "reset(seed=123) twice gave different tasks"


def check_step_before_reset_and_after_end(env: AgentEnv) -> None:
    """Stepping outside an episode raises ResetNeeded; episodes do end under a turn limit."""
    env.close()
    try:
        env.step("hello")
    except ResetNeeded:
        pass
    else:
        raise AssertionError("step() after close() without reset() must raise ResetNeeded")
    from sao_gym.agents import RandomAgent
    from sao_gym.wrappers import TurnLimit

    limited = TurnLimit(env, 4)
    limited.reset(seed=0)
    agent = RandomAgent(seed=0)
    for _ in range(4):
        *_, terminated, truncated, _info = limited.step(agent.space.sample())
        if terminated or truncated:
            break
    assert terminated or truncated, "the episode did not end within the turn limit"
    for target in (limited, env) if terminated else (limited,):
        try:
            target.step("one more")
        except ResetNeeded:
            continue
        raise AssertionError(f"{type(target).__name__}.step after the end must raise ResetNeeded")


def check_hostile_actions(env: AgentEnv) -> None:
    """Malformed and adversarial actions get an observation, never an exception."""
    _, info = env.reset(seed=0)
    failures = []
    for name, action in hostile_actions(info.get("tools", [])).items():
        env.reset(seed=0)
        try:
            obs, reward, terminated, truncated, step_info = env.step(action)
        except Exception as e:  # noqa: BLE001 - reporting is the point
            failures.append(f"{name}: raised {type(e).__name__}: {str(e)[:200]}")
            continue
        if obs not in env.observation_space:
            failures.append(f"{name}: observation is not a non-empty list of messages")
        elif not isinstance(reward, float) or not math.isfinite(reward):
            failures.append(f"{name}: reward {reward!r} is not a finite float")
        elif not isinstance(step_info, dict):
            failures.append(f"{name}: info is not a dict")
        else:
            try:
                json.dumps(obs)
            except (TypeError, ValueError) as e:
                failures.append(f"{name}: observation is not JSON-serialisable ({e})")
    assert not failures, "; ".join(failures)


def check_close_twice(env: AgentEnv) -> None:
    """``aclose``/``close`` may be called twice, and the env can be reset after."""
    env.close()
    env.close()
    obs, _ = env.reset(seed=0)
    assert obs in env.observation_space


def check_gymnasium(env: AgentEnv) -> None:
    """Gymnasium's own ``check_env``, with its warnings treated as failures."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env, skip_render_check=True)
    relevant = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    assert not relevant, "gymnasium check_env warned: " + " | ".join(relevant)


CHECKS: dict[str, Callable[[AgentEnv], None]] = {
    "spaces": check_spaces,
    "reset": check_reset,
    "seed determinism": check_seed_determinism,
    "gymnasium check_env": check_gymnasium,
    "hostile actions": check_hostile_actions,
    "ResetNeeded outside an episode": check_step_before_reset_and_after_end,
    "close twice": check_close_twice,
}


def check_agent_env(env: gymnasium.Env) -> list[str]:
    """Run every check on ``env`` (wrappers are stripped); return the passed names.

    Raises:
        EnvCheckError: listing every failed check with its reason.

    """
    inner = env.unwrapped
    if not isinstance(inner, AgentEnv):
        raise EnvCheckError({"type": f"{type(inner).__name__} is not an AgentEnv"})
    failures: dict[str, str] = {}
    passed = []
    for name, check in CHECKS.items():
        try:
            check(inner)
        except Exception as e:  # noqa: BLE001 - every failure is reported
            failures[name] = f"{type(e).__name__}: {e}"
        else:
            passed.append(name)
    inner.close()
    if failures:
        raise EnvCheckError(failures)
    return passed
