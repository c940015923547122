import random
from fractions import Fraction

import pytest

import sao_gym
from sao_gym.envs.arithmetic.calculator import evaluate, format_number
from sao_gym.envs.arithmetic.env import ArithmeticEnv
from tests.helpers import call, calls_msg


def _submit(env, answer):
    return env.step(calls_msg(call("submit", {"answer": answer})))


@pytest.mark.parametrize("seed", range(30))
def test_reference_answer_scores_one_and_wrong_scores_zero(seed):
    env = sao_gym.make("sao_gym/Arithmetic-v0")
    env.reset(seed=seed)
    task = env.unwrapped.task
    assert task["prompt"] == f"What is {task['expression']}?"
    # slow reference: Python's own integer arithmetic on the same expression
    assert int(task["answer"]) == eval(task["expression"], {"__builtins__": {}})  # noqa: S307
    obs, reward, term, trunc, info = _submit(env, task["answer"])
    assert (reward, term, info["reward_components"]["correct"]) == (1.0, True, 1.0)
    env.reset(seed=seed)
    assert _submit(env, str(int(task["answer"]) + 1))[1:3] == (0.0, True)
    env.close()


def test_answer_formats_accepted():
    env = ArithmeticEnv()
    env.reset(options={"task": {"expression": "6 * 7"}})
    assert _submit(env, 42)[1] == 1.0
    for given in (" 42 ", "42.0", 42.0):
        env.reset(options={"task": {"expression": "6 * 7"}})
        assert _submit(env, given)[1] == 1.0, given
    for given in ("forty-two", "42/0", "", "1e400"):
        env.reset(options={"task": {"expression": "6 * 7"}})
        assert _submit(env, given)[1] == 0.0, given


def test_calculator_matches_python_on_random_expressions():
    rng = random.Random(0)
    for _ in range(300):
        parts = [str(rng.randint(0, 50))]
        for _ in range(rng.randint(1, 5)):
            parts += [rng.choice("+-*"), str(rng.randint(0, 50))]
        expr = " ".join(parts)
        if rng.random() < 0.3:
            expr = f"({expr}) * -{rng.randint(1, 9)}"
        assert evaluate(expr) == eval(expr, {"__builtins__": {}})  # noqa: S307
    assert evaluate("7 / 2") == Fraction(7, 2) and format_number(evaluate("7/2")) == "3.5"
    assert format_number(evaluate("2 ** 10 // 3 % 7")) == str(2**10 // 3 % 7)


@pytest.mark.parametrize("expr, reason", [
    ("9 ** 9 ** 9", "exponents"), ("1/0", "division by zero"), ("2 % 0", "division by zero"),
    ("__import__('os')", "unsupported"), ("a + 1", "unsupported"), ("1 +", "cannot parse"),
    ("1" * 300, "longer than"), ("10 ** 40", "too large"), ("0 ** -1", "division by zero"),
    ("'a' * 3", "unsupported"),
])
def test_calculator_rejects_bad_expressions(expr, reason):
    with pytest.raises(ValueError, match=reason):
        evaluate(expr)


def test_model_written_garbage_raises_no_python_warning():
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match="cannot parse"):
            evaluate("1if 2")
    assert [str(w.message) for w in caught] == []


def test_calculator_tool_reports_errors_as_observations():
    env = ArithmeticEnv()
    env.reset(seed=0)
    obs = env.step(calls_msg(call("calculator", {"expression": "9**9**9"})))[0]
    assert obs[0]["content"].startswith("Error: calculator: exponents")
    obs = env.step(calls_msg(call("calculator", {"expression": "(3 + 4) * 5"})))[0]
    assert obs[0]["content"] == "35"


def test_difficulty_options_and_seeding():
    env = ArithmeticEnv(num_operands=4, max_value=9)
    env.reset(seed=1)
    expr = env.task["expression"].split()
    assert len(expr) == 7 and all(int(x) <= 9 for x in expr[::2])
    env.reset(seed=1, options={"num_operands": 3, "max_value": 1000, "operators": "+"})
    expr = env.task["expression"].split()
    assert len(expr) == 5 and set(expr[1::2]) == {"+"}
    seen = set()
    for s in range(50):
        env.reset(seed=s)
        seen.add(env.task["id"])
    assert len(seen) > 40
    with pytest.raises(ValueError):
        ArithmeticEnv(num_operands=0)
    with pytest.raises(ValueError):
        env.reset(options={"operators": "/"})
    with pytest.raises(ValueError, match="expression"):
        env.reset(options={"task": {"question": "?"}})


def test_turn_limit_from_registration_truncates():
    env = sao_gym.make("sao_gym/Arithmetic-v0", max_episode_steps=2)
    env.reset(seed=0)
    assert env.step("hm")[3] is False
    out = env.step(calls_msg(call("calculator", {"expression": "1+1"})))
    assert out[3] is True and out[4]["stop_reason"] == "max_turns"
