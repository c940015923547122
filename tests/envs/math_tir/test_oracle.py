"""The scripted arithmetic demonstrator of sao_gym/MathTIR-v0: real reasoning-gym questions,
then real episodes (env, bubblewrap sandbox, math-verify) through the warm-start collector."""

from __future__ import annotations

import asyncio
import doctest
import functools
import importlib
import json
import math

import pytest
from transformers import AutoTokenizer

from sao_gym.envs.math_tir import ReasoningGymTasks
from sao_gym.envs.math_tir.oracle import arithmetic_tool_oracle, question_expression
from sao_gym.envs.math_tir.verify import grade_math
from sao_gym.models import COMPACT_TOOLS_TEMPLATE, tiny_model
from sao_gym.registration import env_oracle
from sao_gym.runtime.config.build import oracle_for
from sao_gym.runtime.prepare.demonstrations import collect_demonstrations
from sao_gym.types import StopReason
from tests.sandbox.conftest import backend_class

ENV_ID = "sao_gym/MathTIR-v0"
GENERATORS = ("chain_sum", "basic_arithmetic")


def _tool(content: str, name: str = "python") -> list[dict]:
    return [{"role": "tool", "name": name, "content": content}]


def _tasks(name: str, n: int, size: int = 100) -> list[dict]:
    tasks = ReasoningGymTasks([name], size=size)
    return [tasks.task(name, i) for i in range(n)]


def test_docstring_examples():
    mod = importlib.import_module("sao_gym.envs.math_tir.oracle")
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_registered_for_warm_starts():
    assert env_oracle(ENV_ID) is arithmetic_tool_oracle
    assert oracle_for(ENV_ID) is arithmetic_tool_oracle
    bound = oracle_for(ENV_ID, slip_rate=0.25, seed=3)
    assert bound.func is arithmetic_tool_oracle and bound.keywords == {"slip_rate": 0.25, "seed": 3}


# ----- question_expression on real reasoning-gym questions -----------------------------------
@pytest.mark.parametrize("name", GENERATORS)
def test_question_expression_evaluates_to_the_reference(name):
    for task in _tasks(name, 30):
        expr = question_expression(task["prompt"])
        # the extracted text is exactly the generator's own expression
        assert expr == task["metadata"]["expression"], task["prompt"]
        value = eval(expr)  # noqa: S307 - reasoning-gym's own arithmetic
        if name == "chain_sum":
            assert isinstance(value, int) and str(value) == task["answer"], task["prompt"]
        else:  # '/' makes a float; the generator's divisions are exact on these 30 tasks
            assert math.isclose(float(value), float(task["answer"]), rel_tol=1e-12, abs_tol=1e-9), \
                (task["prompt"], value, task["answer"])


def test_basic_arithmetic_reference_is_floor_division():
    """Documents a limit of the oracle: reasoning-gym's basic_arithmetic reference is the
    expression evaluated with ``//`` (``eval_floordiv``), and its generator does not always make
    the divisions exact (~1% of tasks), so there ``print(EXPR)`` shows a non-integer that the
    grader marks wrong: the slip-free oracle is not rewarded on every basic_arithmetic task."""
    for task in _tasks("basic_arithmetic", 30):
        expr = question_expression(task["prompt"])
        assert str(eval(expr.replace("/", "//"))) == task["answer"]  # noqa: S307
    tasks = ReasoningGymTasks(["basic_arithmetic"], size=10_000)
    inexact = tasks.task("basic_arithmetic", 116)
    assert inexact["prompt"] == "Calculate 542 + -9 + -438 / -( 953 * -340 + -324018 )."
    printed = str(eval(question_expression(inexact["prompt"])))  # noqa: S307
    assert (printed, inexact["answer"]) == ("532.9993241137093", "532")
    assert not grade_math(inexact["answer"], printed)["correct"]
    # a tiny inexact quotient prints in scientific notation: still a number, so it is submitted
    # (it used to be taken for an error, and the oracle re-ran python until the turn budget)
    tiny = tasks.task("basic_arithmetic", 9113)
    printed = str(eval(question_expression(tiny["prompt"])))  # noqa: S307
    assert (printed, tiny["answer"]) == ("-3.531281266552881e-05", "-1")
    assert arithmetic_tool_oracle(_tool(printed + "\n"), tiny) == f"submit_answer({printed})"


@pytest.mark.parametrize("question", [
    "What is the capital of France?",
    "Find 42.",
    "What is 3?",
    "",
])
def test_question_without_expression_raises(question):
    with pytest.raises(ValueError, match=r"no arithmetic expression.*chain_sum, basic_arithmetic"):
        question_expression(question)
    task = {"id": "q", "prompt": question}
    with pytest.raises(ValueError, match="chain_sum, basic_arithmetic"):
        arithmetic_tool_oracle([{"role": "user", "content": question}], task)


# ----- turns -------------------------------------------------------------------------------
TASK = {"id": "t", "prompt": "Calculate 5 - 3 - 6."}
RUN = "python(print(5 - 3 - 6))"


@pytest.mark.parametrize("content", [
    "Traceback (most recent call last):\n  File \"<stdin>\", line 1\nNameError: name 'x' is not "
    "defined\n",
    "Error: exit status 1.\n[stderr]\nTraceback (most recent call last):\nZeroDivisionError: "
    "division by zero",
    "Error: the code ran longer than 10 s and was killed.",
    "(no output: print() the values you want to see)",
    "[stdout]\n-4\n[stderr]\nDeprecationWarning: something",
    "-4 -4",
    "",
])
def test_after_a_python_error_it_runs_python_again(content):
    assert arithmetic_tool_oracle(_tool(content), TASK) == RUN
    assert arithmetic_tool_oracle(_tool(content), TASK, slip_rate=1.0) == RUN


def test_turns():
    assert arithmetic_tool_oracle([], TASK) == RUN
    assert arithmetic_tool_oracle([{"role": "system", "content": "S"},
                                   {"role": "user", "content": TASK["prompt"]}], TASK) == RUN
    for out in ("-4\n", "  -4  ", "2.5", "106475279601.0", "1e+16", "-3.5E-05"):
        assert arithmetic_tool_oracle(_tool(out), TASK) == f"submit_answer({out.strip()})"
    # only the python tool's output is submitted
    assert arithmetic_tool_oracle(_tool("-4", name="submit_answer"), TASK) == RUN
    assert arithmetic_tool_oracle([{"role": "user", "content": "-4"}], TASK) == RUN


@pytest.mark.parametrize("rate", [-0.1, 1.0001, 2, float("nan"), float("inf")])
def test_slip_rate_outside_unit_interval_raises(rate):
    with pytest.raises(ValueError, match=r"slip_rate must be in \[0, 1\]"):
        arithmetic_tool_oracle(_tool("-4"), TASK, slip_rate=rate)
    with pytest.raises(ValueError, match="slip_rate"):
        arithmetic_tool_oracle([], TASK, slip_rate=rate)


def _submitted(task: dict, **kw) -> str:
    text = arithmetic_tool_oracle(_tool(task["answer"] + "\n"), task, **kw)
    assert text.startswith("submit_answer(") and text.endswith(")"), text
    return text[len("submit_answer("):-1]


def test_slips_are_a_stable_function_of_seed_and_task_id():
    tasks = _tasks("chain_sum", 40) + _tasks("basic_arithmetic", 40)
    assert all(_submitted(t) == t["answer"] for t in tasks)
    assert all(_submitted(t, slip_rate=1.0) != t["answer"] for t in tasks)
    by_seed = {}
    for seed in range(4):
        slipped = [_submitted(t, slip_rate=0.3, seed=seed) != t["answer"] for t in tasks]
        assert slipped == [_submitted(t, slip_rate=0.3, seed=seed) != t["answer"] for t in tasks]
        # copy of the task, other prompt and answer: only the id counts
        same_id = [{"id": t["id"], "prompt": "Calculate 1 + 1.", "answer": t["answer"]}
                   for t in tasks]
        assert slipped == [_submitted(t, slip_rate=0.3, seed=seed) != t["answer"] for t in same_id]
        for half in (slipped[:40], slipped[40:]):  # Binomial(40, 0.3): mean 12, sd 2.9
            assert 3 <= sum(half) <= 21, (seed, sum(half))
        by_seed[seed] = slipped
    assert len({tuple(s) for s in by_seed.values()}) == 4
    # a lower rate slips on a subset of the tasks of a higher one (same hash, same seed)
    low = [_submitted(t, slip_rate=0.1, seed=0) != t["answer"] for t in tasks]
    assert all(b for a, b in zip(low, by_seed[0], strict=True) if a)


def test_a_slip_miscopies_exactly_one_digit():
    for task in _tasks("chain_sum", 40) + _tasks("basic_arithmetic", 40):
        answer = task["answer"]
        wrong = _submitted(task, slip_rate=1.0, seed=7)
        assert wrong == _submitted(task, slip_rate=1.0, seed=7)
        assert len(wrong) == len(answer)
        diff = [i for i, (a, b) in enumerate(zip(answer, wrong, strict=True)) if a != b]
        assert len(diff) == 1 and answer[diff[0]].isdigit() and wrong[diff[0]].isdigit()
        assert int(wrong) != int(answer)


# ----- end to end: real env, real sandbox, warm-start collector ------------------------------
@pytest.fixture
def local_sandbox() -> None:
    """Skips without bubblewrap, unless SAO_SANDBOX_REQUIRE names ``local``."""
    asyncio.run(backend_class("local"))


@pytest.fixture(scope="module")
def compact_tokenizer(tmp_path_factory):
    path = tiny_model(tmp_path_factory.mktemp("oracle_model"), chat_template=COMPACT_TOOLS_TEMPLATE)
    return AutoTokenizer.from_pretrained(path)


def _collect(tokenizer, oracle, **kw):
    return collect_demonstrations(ENV_ID, tokenizer, oracle, episodes=12,
                                  env_kwargs={"generators": ["chain_sum"]},
                                  max_new_tokens=64, max_context_tokens=1024, **kw)


def _calls(rollout) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"]))
            for m in rollout.messages if m["role"] == "assistant" for c in m["tool_calls"]]


def _python_output(rollout) -> str:
    [out] = [m["content"] for m in rollout.messages
             if m["role"] == "tool" and m.get("name") == "python"]
    return out.strip()


@pytest.mark.slow
def test_slip_free_demonstrations_are_all_rewarded(local_sandbox, compact_tokenizer):
    demos = _collect(compact_tokenizer, arithmetic_tool_oracle)
    assert len(demos) == 12
    assert len({r.task_id for r in demos}) > 1
    for r in demos:
        assert (r.reward, r.metrics["turns"], r.metrics["python_calls"]) == (1.0, 2, 1)
        assert r.stop_reason is StopReason.TERMINATED and not r.infra_failure
        (run, code), (submit, answer) = _calls(r)
        question = next(m["content"] for m in r.messages if m["role"] == "user")
        assert (run, code) == ("python", {"code": f"print({question_expression(question)})"})
        assert (submit, answer) == ("submit_answer", {"answer": _python_output(r)})


@pytest.mark.slow
def test_always_slipping_demonstrations_are_never_rewarded(local_sandbox, compact_tokenizer):
    demos = _collect(compact_tokenizer, functools.partial(arithmetic_tool_oracle, slip_rate=1.0))
    for r in demos:
        assert (r.reward, r.metrics["turns"]) == (0.0, 2)
        assert r.stop_reason is StopReason.TERMINATED and not r.infra_failure
        assert _calls(r)[1][1]["answer"] != _python_output(r)


@pytest.mark.slow
def test_slipped_demonstrations_are_reproducible(local_sandbox, compact_tokenizer):
    oracle = functools.partial(arithmetic_tool_oracle, slip_rate=0.3, seed=4)
    first = _collect(compact_tokenizer, oracle, seed=20)
    again = _collect(compact_tokenizer, oracle, seed=20)
    assert [r.token_ids for r in first] == [r.token_ids for r in again]
    assert [r.reward for r in first] == [r.reward for r in again]
    slipped = []
    for r in first:
        out = _python_output(r)
        task = {"id": r.task_id, "answer": out}
        predicted = _submitted(task, slip_rate=0.3, seed=4) != out  # the oracle alone, no env
        assert _calls(r)[1][1]["answer"] == _submitted(task, slip_rate=0.3, seed=4)
        assert r.reward == (0.0 if predicted else 1.0)
        slipped.append(predicted)
    assert 0 < sum(slipped) < len(slipped)  # this seed has both kinds
