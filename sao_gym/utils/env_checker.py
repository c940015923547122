"""``check_agent_env``: conformance checks every agent environment must pass.

Small ``check_*`` functions, each raising ``AssertionError`` with the likely
cause. :func:`check_agent_env` runs them all (plus Gymnasium's own
``check_env``, with its warnings treated as failures) and raises
:class:`EnvCheckError` listing every failure, or returns the names of the
checks that passed. A reset that raises fails the ``reset`` check alone: the
checks after it all need a working reset and are skipped. What is suspicious
but may be intended (the task's answer readable in its id,
:func:`leaked_answers`) is an :class:`EnvCheckWarning`, not a failure.

:class:`OncePerError` keeps a run of many episodes (``sao-gym check``) from
logging the same traceback once per episode.

The environment is driven through its sync API (``reset``/``step``/``close``),
which itself drives ``areset``/``astep``/``aclose``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import warnings
from collections.abc import Callable, Mapping
from copy import deepcopy
from types import TracebackType
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


class EnvCheckWarning(UserWarning):
    """Something that may be intended but usually is a mistake (see :func:`check_agent_env`)."""


ANSWER_KEYS = ("answer", "answers", "solution", "solutions", "secret", "target", "reference",
               "expected", "expected_output", "ground_truth", "gold", "label")
"""Task keys (compared lower-case) whose values :func:`leaked_answers` looks for in the id."""


def _answer_strings(value: Any) -> list[str]:
    """The texts of an answer-like value worth looking for in an id.

    Numbers (not booleans) of any length, strings of 2 characters or more (a
    lone letter or digit matches too much by chance), and the items of a list
    or tuple of them.
    """
    if isinstance(value, (list, tuple)):
        return [text for item in value for text in _answer_strings(item)]
    if isinstance(value, bool):
        return []
    if isinstance(value, (int, float)):
        return [str(value)]
    if isinstance(value, str) and len(value.strip()) >= 2:
        return [value.strip()]
    return []


def leaked_answers(task: Mapping[str, Any], shown: str = "") -> list[str]:
    """The answer-like keys of ``task`` whose value can be read in ``task["id"]``.

    The id reaches clients (OpenEnv sends it on reset, rollouts record it), so
    an id such as ``f"guess-{secret}"`` hands out the answer. A key counts
    when its name is in :data:`ANSWER_KEYS` and a text of its value
    (:func:`_answer_strings`) appears in ``str(task["id"])`` as a whole token
    (not inside a longer run of letters and digits: answer 86 is in
    ``guess-86``, not in ``guess-186``), unless that text is also in
    ``shown`` (what the model is shown anyway, e.g. the prompt).

    Example:
        >>> leaked_answers({"id": "guess-86", "prompt": "Guess", "answer": 86})
        ['answer']
        >>> leaked_answers({"id": "guess-5f3a", "prompt": "Guess", "answer": 86})
        []

    """
    task_id = str(task.get("id", ""))
    found = []
    for key, value in task.items():
        if not isinstance(key, str) or key.lower() not in ANSWER_KEYS:
            continue
        for text in _answer_strings(value):
            token = rf"(?<![A-Za-z0-9]){re.escape(text)}(?![A-Za-z0-9])"
            if re.search(token, task_id) and not re.search(token, shown):
                found.append(key)
                break
    return found


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
    _assert_task(getattr(env, "task", None))


def check_task(env: AgentEnv) -> None:
    """After reset, ``env.task`` is a mapping with an ``id``: a non-empty string or an int.

    Rollouts record the id, evaluations and clients (OpenEnv) key tasks by
    it. Part of the ``reset`` check.
    """
    env.reset(seed=0)
    _assert_task(getattr(env, "task", None))


def _assert_task(task: Any) -> None:
    hint = "set self.task in on_reset: a dict with an 'id' and a 'prompt' (docs/new_env.md)"
    assert isinstance(task, Mapping), (
        f"after reset, env.task must be a mapping with an 'id', got {type(task).__name__}; {hint}"
    )
    assert "id" in task, (
        f"after reset, env.task has no 'id' (keys: {sorted(map(str, task))}); {hint}"
    )
    task_id = task["id"]
    assert isinstance(task_id, (str, int)) and not isinstance(task_id, bool) and task_id != "", (
        f"env.task['id'] must be a non-empty string or an int, got {task_id!r}; {hint}"
    )


def task_warnings(env: AgentEnv) -> list[str]:
    """What is suspicious about the task after ``reset(seed=0)``: answers readable in its id."""
    obs, _ = env.reset(seed=0)
    task = getattr(env, "task", None)
    if not isinstance(task, Mapping):
        return []
    shown = "\n".join([str(task.get("prompt", "")),
                       *(m["content"] for m in obs if isinstance(m.get("content"), str))])
    return [
        f"the task id {str(task['id'])!r} holds task[{key!r}]: the id is sent to clients "
        "(OpenEnv) on reset, so the answer leaks; derive the id from something else "
        "(the seed, an index)"
        for key in leaked_answers(task, shown)
    ]


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


class _NoToolCalls(AssistantMessageSpace):
    """An action space whose samples call no tool of the env (its ``tools`` stay empty)."""

    @property
    def tools(self) -> list[Mapping[str, Any]]:
        return []

    @tools.setter
    def tools(self, value: Any) -> None:
        pass


def check_gymnasium(env: AgentEnv) -> None:
    """Gymnasium's own ``check_env``, with its warnings treated as failures.

    Its actions are text and calls of unknown tools, not of the env's own:
    its step-determinism check compares step infos exactly, and a real tool
    call's ``info["metrics"]`` may hold timings. (The random episodes of
    ``sao-gym check`` call the env's tools.)
    """
    space = env.action_space
    env.action_space = _NoToolCalls(seed=0)  # seeded: check_env's first sample is not
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            check_env(env, skip_render_check=True)
    finally:
        env.action_space = space
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

    When every check passes, what is suspicious but may be intended
    (:func:`task_warnings`) is reported with ``warnings.warn(...,
    EnvCheckWarning)``.

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
            if name == "reset" and not isinstance(e, AssertionError):
                # reset() itself raised: every later check resets, one report is enough
                failures[name] += " (the other checks need reset() and were skipped)"
                break
        else:
            passed.append(name)
    if not failures:
        for text in task_warnings(inner):
            warnings.warn(text, EnvCheckWarning, stacklevel=2)
    inner.close()
    if failures:
        raise EnvCheckError(failures)
    return passed


def _error_key(exc: BaseException) -> tuple[str, str, str, int]:
    """An exception's type, message and raising location (the innermost frame)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    where = (tb.tb_frame.f_code.co_filename, tb.tb_lineno) if tb is not None else ("?", 0)
    return type(exc).__qualname__, str(exc), *where


class OncePerError(logging.Filter):
    """While active, let the first log record of each distinct error through and count repeats.

    Two records show the same error when their exceptions (``exc_info``)
    have the same type, message and raising location (file and line of the
    innermost frame); records without an exception always pass. Used as a
    context manager, it filters the root logger's handlers (or Python's
    last-resort handler where there are none); :meth:`summary` then names
    each error that repeated.

    Example:
        >>> with OncePerError() as errors:
        ...     for _ in range(3):
        ...         try:
        ...             {}["k"]
        ...         except KeyError:
        ...             logging.getLogger("demo").exception("failed")  # shown once
        >>> errors.summary()[0].startswith("(same error 2 more times: KeyError: 'k', raised at")
        True

    """

    def __init__(self) -> None:
        super().__init__()
        self.repeats: dict[tuple[str, str, str, int], int] = {}
        """Each error seen (see :func:`_error_key`) and how often it came again."""
        self._mark = f"_sao_gym_repeat_{id(self)}"
        self._handlers: list[logging.Handler] = []

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether ``record`` is shown (decided once per record, however many handlers)."""
        if not hasattr(record, self._mark):
            exc = record.exc_info[1] if record.exc_info else None
            repeat = False
            if exc is not None:
                key = _error_key(exc)
                repeat = key in self.repeats
                self.repeats[key] = self.repeats[key] + 1 if repeat else 0
            setattr(record, self._mark, repeat)
        return not getattr(record, self._mark)

    def summary(self) -> list[str]:
        """One line per error that repeated: ``(same error N more times: ...)``."""
        lines = []
        for (kind, message, path, line), n in self.repeats.items():
            if n:
                text = " ".join(message.split())
                text = text if len(text) <= 200 else text[:200] + "..."
                lines.append(f"(same error {n} more time{'s' if n > 1 else ''}: {kind}: "
                             f"{text}, raised at {os.path.basename(path)}:{line})")
        return lines

    def __enter__(self) -> OncePerError:
        self._handlers = list(logging.getLogger().handlers)
        if not self._handlers and logging.lastResort is not None:
            self._handlers = [logging.lastResort]
        for handler in self._handlers:
            handler.addFilter(self)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for handler in self._handlers:
            handler.removeFilter(self)
        self._handlers = []
