"""The env checker's hints to env authors: on_reset's result, task ids, answers in ids, errors."""

from __future__ import annotations

import importlib.util
import logging
import warnings
from pathlib import Path

import pytest

import sao_gym
from sao_gym.tools import ToolEnv, tool
from sao_gym.utils.env_checker import (
    CHECKS,
    EnvCheckError,
    EnvCheckWarning,
    OncePerError,
    check_agent_env,
    leaked_answers,
)

FAST_BUILTINS = ["sao_gym/Arithmetic-v0", "sao_gym/HeavyTail-v0"]


class Pick(ToolEnv):
    """Pick the right colour; the task (and what on_reset returns) is set per test."""

    task_maker = staticmethod(lambda secret: {"id": "pick", "prompt": "pick one", "answer": secret})

    async def on_reset(self, options):
        self.secret = ["red", "green", "blue"][int(self.np_random.integers(0, 3))]
        self.task = self.task_maker(self.secret)
        return [{"role": "user", "content": "Pick a colour."}], {}

    @tool(description="Pick a colour.", parameters={
        "type": "object", "properties": {"colour": {"type": "string"}}, "required": ["colour"],
        "additionalProperties": False})
    def pick(self, colour):
        return "yes" if colour == self.secret else "no"


def _env(task_maker):
    return type("PickVariant", (Pick,), {"task_maker": staticmethod(task_maker)})()


def test_a_well_formed_env_passes_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error", EnvCheckWarning)
        assert check_agent_env(Pick()) == list(CHECKS)


# ----- on_reset must return (messages, info) -----
class StringReset(Pick):
    async def on_reset(self, options):
        return "Pick a colour."


class ThreeTupleReset(Pick):
    async def on_reset(self, options):
        return [{"role": "user", "content": "x"}], {}, "extra"


def test_on_reset_returning_a_string_raises_one_clear_error():
    with pytest.raises(TypeError, match=r"StringReset\.on_reset must return \(messages, info\)"
                       r": a list of message dicts and a dict; got str"):
        StringReset().reset(seed=0)
    with pytest.raises(TypeError, match=r"got a tuple of 3"):
        ThreeTupleReset().reset(seed=0)


def test_the_checker_reports_a_bad_on_reset_once():
    with pytest.raises(EnvCheckError) as exc:
        check_agent_env(StringReset())
    assert list(exc.value.failures) == ["reset"]
    text = str(exc.value)
    assert text.count("on_reset must return (messages, info)") == 1
    assert "too many values to unpack" not in text


# ----- the task: a mapping with an id -----
@pytest.mark.parametrize("task_maker, why", [
    (lambda secret: None, "NoneType"),
    (lambda secret: "pick one", "str"),
    (lambda secret: {"prompt": "pick one", "answer": secret}, "no 'id'"),
    (lambda secret: {"id": None, "prompt": "pick one"}, "None"),
    (lambda secret: {"id": 1.5, "prompt": "pick one"}, "1.5"),
    (lambda secret: {"id": True, "prompt": "pick one"}, "True"),
    (lambda secret: {"id": "", "prompt": "pick one"}, "''"),
])
def test_a_task_without_an_id_fails_the_checker(task_maker, why):
    with pytest.raises(EnvCheckError) as exc:
        check_agent_env(_env(task_maker))
    assert list(exc.value.failures) == ["reset"]
    reason = exc.value.failures["reset"]
    assert "env.task" in reason and "'id'" in reason and why in reason


@pytest.mark.parametrize("task_id", ["pick-7", 7])
def test_string_and_int_ids_pass(task_id):
    assert check_agent_env(_env(lambda s: {"id": task_id, "prompt": "p"})) == list(CHECKS)


@pytest.mark.parametrize("env_id", FAST_BUILTINS)
def test_fast_builtin_envs_still_pass_without_warnings(env_id):
    with warnings.catch_warnings():
        warnings.simplefilter("error", EnvCheckWarning)
        assert check_agent_env(sao_gym.make(env_id, latency_median_s=0.001)
                               if "HeavyTail" in env_id else sao_gym.make(env_id)) == list(CHECKS)


# ----- the answer must not be readable in the id -----
def test_an_id_that_holds_the_answer_warns_naming_the_key():
    env = _env(lambda secret: {"id": f"pick-{secret}", "prompt": "pick one", "answer": secret})
    leak = r"task id 'pick-(red|green|blue)' holds task\['answer'\]"
    with pytest.warns(EnvCheckWarning, match=leak):
        assert check_agent_env(env) == list(CHECKS)


@pytest.mark.parametrize("task, keys", [
    ({"id": "guess-86", "answer": 86}, ["answer"]),
    ({"id": "guess-86", "secret": "86"}, ["secret"]),
    ({"id": "q:blue-sky", "solution": "blue", "target": "sky"}, ["solution", "target"]),
    ({"id": "t-4", "expected": [3, 4]}, ["expected"]),
    ({"id": 86, "reference": 86}, ["reference"]),
    # not leaks: short strings, substrings of a longer token, shown in the prompt, no answer key
    ({"id": "task-a", "answer": "a"}, []),
    ({"id": "guess-186", "answer": 86}, []),
    ({"id": "rg:42:7", "answer": 4}, []),
    ({"id": "arithmetic:12*1", "answer": "12", "prompt": "What is 12*1?"}, []),
    ({"id": "guess-86", "seed": 86}, []),
    ({"id": "guess-1", "answer": True}, []),
])
def test_leaked_answers(task, keys):
    assert leaked_answers(task, shown=task.get("prompt", "")) == keys


def test_the_documented_example_keeps_its_answer_out_of_the_id(monkeypatch):
    path = Path(__file__).resolve().parents[2] / "examples" / "new_env.py"
    spec = importlib.util.spec_from_file_location("new_env_example_ids", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setattr(sao_gym, "register", lambda *args, **kwargs: None)  # the class only
    spec.loader.exec_module(module)
    env = module.GuessNumberEnv()
    with warnings.catch_warnings():
        warnings.simplefilter("error", EnvCheckWarning)
        assert check_agent_env(env) == list(CHECKS)
    for seed in range(20):
        env.reset(seed=seed)
        assert leaked_answers(env.task) == [], env.task
    env.close()


def test_the_answer_in_the_first_observation_is_no_leak():
    task = {"id": "guess-86", "answer": 86}
    assert leaked_answers(task, shown="Is it 86?") == []


# ----- one traceback per distinct error -----
def _raise(exc):
    raise exc


def _log_failure(logger, exc):
    try:
        _raise(exc)
    except Exception:
        logger.exception("episode failed")


def test_once_per_error_lets_each_distinct_error_through_once(caplog):
    logger = logging.getLogger("tests.once_per_error")
    with caplog.at_level(logging.ERROR), OncePerError() as errors:
        for _ in range(10):
            _log_failure(logger, KeyError("gone"))
        for _ in range(3):
            _log_failure(logger, KeyError("other"))
        logger.error("no traceback")
        logger.error("no traceback")
    shown = [r for r in caplog.records if r.name == "tests.once_per_error"]
    assert [(r.exc_info[1].args if r.exc_info else None) for r in shown] == [
        ("gone",), ("other",), None, None]
    assert errors.summary() == [
        "(same error 9 more times: KeyError: 'gone', raised at test_env_checker.py:"
        f"{_raise.__code__.co_firstlineno + 1})",
        "(same error 2 more times: KeyError: 'other', raised at test_env_checker.py:"
        f"{_raise.__code__.co_firstlineno + 1})",
    ]
    _log_failure(logger, KeyError("gone"))  # outside the block: shown again
    assert caplog.records[-1].exc_info is not None
