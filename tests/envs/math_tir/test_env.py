"""sao_gym/MathTIR-v0: real reasoning-gym tasks, real math-verify, real bubblewrap sandbox."""

from __future__ import annotations

import asyncio
import gzip
import importlib.util
import json
import sys
import time
import uuid

import pytest

import sao_gym
from sao_gym.agents import ScriptedAgent
from sao_gym.envs.math_tir import MathTIREnv, ReasoningGymTasks, grade_answer, load_tasks
from sao_gym.envs.math_tir.data import DEFAULT_GENERATORS, extract_reference
from sao_gym.envs.math_tir.verify import (
    extract_boxed,
    grade_math,
    safe_sympify,
    screen_for_scorer,
    verifier_pool,
)
from sao_gym.sandbox import SandboxCrashed, SandboxUnavailable
from sao_gym.types import StopReason
from sao_gym.utils.env_checker import check_agent_env
from tests.helpers import call, calls_msg
from tests.sandbox.conftest import backend_class

ENV_ID = "sao_gym/MathTIR-v0"


def _py(code: str) -> dict:
    return calls_msg(call("python", {"code": code}))


def _submit(answer) -> dict:
    return calls_msg(call("submit_answer", {"answer": answer}))


def _wrong(answer: str) -> str:
    return str(int(answer) + 1)


@pytest.fixture(params=["local", "docker"])
async def backend(request) -> str:
    """A sandbox backend that runs here (skips otherwise, unless SAO_SANDBOX_REQUIRE names it)."""
    await backend_class(request.param)
    return request.param


@pytest.fixture
async def local_backend() -> str:
    await backend_class("local")
    return "local"


# ----- answer extraction and comparison ----------------------------------------------------------
def test_extract_boxed_and_references():
    assert extract_boxed(r"thus \boxed{\frac{1}{2}} and \boxed{7}") == "7"
    assert extract_boxed(r"\boxed{\frac{a}{\sqrt{b}}}") == r"\frac{a}{\sqrt{b}}"
    assert extract_boxed(r"\fbox{12}") == "12"
    assert extract_boxed(r"unbalanced \boxed{12") is None
    assert extract_boxed("nothing here") is None
    assert extract_reference("Natalia sold 48/2 = 24 clips.\n#### 1,072") == "1072"
    assert extract_reference(r"Hence $x=\boxed{\dfrac{3}{4}}$.", "math") == r"\dfrac{3}{4}"
    assert extract_reference("  204 ", "plain") == "204"
    assert extract_reference("no hashes", "gsm8k") is None
    with pytest.raises(ValueError, match="answer_format"):
        extract_reference("1", "latex")


@pytest.mark.parametrize("gold, pred, correct", [
    ("72", "72", True), ("72", "72.0", True), ("72", r"\boxed{72}", True),
    ("72", "72 apples", True), ("1072", "1,072", True), (r"\frac{1}{2}", "0.5", True),
    (r"\frac{1}{2}", "1/2", True), ("1024", "2**10", True), (r"3\pi", "3*pi", True),
    (r"\frac{\sqrt{2}}{2}", "sqrt(2)/2", True), ("-4", "-4", True),
    ("72", "73", False), ("72", "-72", False), ("72", "hello", False), ("72", "", False),
    (r"\frac{1}{2}", "0.51", False), ("1024", "2**11", False),
])
def test_grade_math(gold, pred, correct):
    assert grade_math(gold, pred)["correct"] is correct


def test_safe_sympify_converts_math_and_refuses_code():
    import sympy

    assert safe_sympify("2**10") == 1024
    assert safe_sympify("sqrt(8)/2") == sympy.sqrt(2)
    assert safe_sympify(r"\frac{3}{4}") == sympy.Rational(3, 4)
    assert safe_sympify("(1, 2)") == sympy.Tuple(1, 2)
    for hostile in ["__import__('os').system('x')", "open('f')", "().__class__", "x.y",
                    "lambda: 1", "[i for i in (1,)]", "9**9**9", "factorial(10**6)",
                    "a" * 600, "(" * 200 + ")" * 200, "'str'"]:
        assert safe_sympify(hostile) is None, hostile


@pytest.mark.parametrize("answer", [
    "94*4 - 61 - 6", "2 × 2 × 5 × 7", "-3.625, 0.0", "$244/607$", r"\frac{3}{4}", "True",
    "sqrt(2) + 1", "-15.0 + 3.0i",
])
def test_scorer_screen_lets_answers_through(answer):
    assert screen_for_scorer(answer) is None


@pytest.mark.parametrize("answer, reason", [
    ("__import__('os')", "character"), ("exec(chr(95))", "exec"), ("(exec)(1)", "exec"),
    ("x.real", "attribute"), ("(sqrt := 1)", "assignment"), ("lambda x: x", "lambda"),
    ("f(1)", "call"), ("(1)(2)", "call"), ("x\\\n(1)", "call"), ("open(1)", "open"),
    ("a\x00b", "character"), ("1" * 3000, "too long"),
])
def test_scorer_screen_refuses_code(answer, reason):
    assert reason in (screen_for_scorer(answer) or "accepted")


# ----- oracle: reference answers score 1, wrong ones 0 -------------------------------------------
@pytest.mark.slow
async def test_oracle_over_generated_tasks_of_each_default_generator():
    tasks = ReasoningGymTasks(DEFAULT_GENERATORS)
    batch = [tasks.task(g, i) for g in DEFAULT_GENERATORS for i in range(300)]
    assert all(t["grader"] == "math_verify" for t in batch)
    assert all(t["answer"].lstrip("-").isdigit() for t in batch)  # why math-verify suits them
    good = await asyncio.gather(*(grade_answer(t["answer"], t) for t in batch))
    bad = await asyncio.gather(*(grade_answer(_wrong(t["answer"]), t) for t in batch))
    failed = [(t["id"], g.method) for t, g in zip(batch, good, strict=True) if not g.correct]
    accepted = [t["id"] for t, g in zip(batch, bad, strict=True) if g.correct]
    assert not failed and not accepted, (failed[:5], accepted[:5])
    assert {g.method for g in good} == {"math_verify"}


@pytest.mark.slow
async def test_scorer_graded_generators_use_their_own_rules():
    gens = ["countdown", "fraction_simplification", "prime_factorization", "power_function"]
    tasks = ReasoningGymTasks(gens)
    wrong = {
        "countdown": lambda t: f"{t['metadata']['target']}",  # right value, numbers unused
        "fraction_simplification": lambda t: "{}/{}".format(  # equal value, not lowest terms
            2 * t["metadata"]["simplified_numerator"],
            2 * t["metadata"]["simplified_denominator"]),
        "prime_factorization": lambda t: t["answer"] + " × 2",
        "power_function": lambda t: str(float(t["answer"]) * 2 + 1),
    }
    for g in gens:
        batch = [tasks.task(g, i) for i in range(40)]
        assert all(t["grader"] == "scorer" for t in batch)
        good = await asyncio.gather(*(grade_answer(t["answer"], t) for t in batch))
        bad = await asyncio.gather(*(grade_answer(wrong[g](t), t) for t in batch))
        assert all(r.correct and r.method == "scorer" for r in good), (g, good[:3])
        assert not any(r.correct for r in bad), (g, [t["answer"] for t in batch][:3])


async def test_scorer_screen_blocks_code_in_answers(tmp_path):
    task = ReasoningGymTasks(["countdown"]).task("countdown", 0)  # its scorer eval()s answers
    marker = tmp_path / f"pwned-{uuid.uuid4().hex}"
    for answer in [f"__import__('os').system('touch {marker}')", "exec(chr(95))",
                   task["answer"] + " + 0*open(1)"]:
        result = await grade_answer(answer, task)
        assert (result.correct, result.method) == (False, "screen")
    assert not marker.exists()


def test_oracle_through_the_env_with_tool_boxed_and_wrong_answers():
    env = sao_gym.make(ENV_ID)
    seen = set()
    for seed in range(24):
        env.reset(seed=seed)
        task = env.unwrapped.task
        seen.add(task["generator"])
        if seed % 3 == 0:
            obs, reward, term, _, info = env.step(f"So it is $\\boxed{{{task['answer']}}}$.")
            assert obs == [{"role": "user", "content": "Correct."}]
            assert info["grading"]["via"] == "boxed"
        else:
            obs, reward, term, _, info = env.step(_submit(task["answer"]))
            assert obs[0]["content"] == "Correct."
        assert (reward, term) == (1.0, True)
        assert info["reward_components"] == {"correctness": 1.0, "format": 1.0}
        env.reset(seed=seed)
        obs, reward, term, _, info = env.step(_submit(_wrong(task["answer"])))
        assert (reward, term, obs[0]["content"]) == (0.0, True, "Incorrect.")
        assert info["reward_components"] == {"correctness": 0.0, "format": 1.0}
    assert seen == set(DEFAULT_GENERATORS)
    env.close()


# ----- the verifier's own time bound -------------------------------------------------------------
@pytest.mark.slow
async def test_pathological_answers_time_out_without_blocking_the_loop():
    task = {"id": "t", "prompt": "?", "answer": "72", "grader": "math_verify"}
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.05)
            ticks += 1

    ticking = asyncio.create_task(ticker())
    try:
        # math-verify's verify() never returns on these (sympy evaluates the tower)
        for answer in [r"9^{9^{9^{9}}}", r"(10^{10^{8}})!"]:
            start = time.perf_counter()
            before = ticks
            result = await grade_answer(answer, task, timeout_s=1.5)
            elapsed = time.perf_counter() - start
            assert (result.correct, result.method, result.timed_out) == (False, "timeout", True)
            assert elapsed < 1.5 + 3.0  # + starting a replacement worker at most
            assert ticks - before >= 0.5 * elapsed / 0.05  # the loop kept running
    finally:
        ticking.cancel()
    started = verifier_pool().started
    assert (await grade_answer("72", task)).correct  # a fresh worker took over
    assert verifier_pool().started >= started


def test_env_grading_timeout_scores_zero():
    env = MathTIREnv(verify_timeout_s=1.0)
    env.reset(options={"task": {"prompt": "What is 8*9?", "answer": "72"}})
    obs, reward, term, _, info = env.step(_submit(r"9^{9^{9^{9}}}"))
    assert (reward, term, info["grading"]["timed_out"]) == (0.0, True, True)
    env.close()


# ----- the python tool in a real sandbox ---------------------------------------------------------
def test_python_tool_runs_real_code(backend):
    env = MathTIREnv(sandbox=backend, python_timeout_s=20)
    env.reset(seed=0)
    obs, reward, term, _, info = env.step(_py("print(2**100)"))
    assert obs[0]["content"] == "1267650600228229401496703205376\n"
    assert (obs[0]["role"], obs[0]["name"], reward, term) == ("tool", "python", 0.0, False)
    assert info["metrics"]["python_calls"] == 1.0 and info["metrics"]["python_s"] > 0
    obs = env.step(_py("import sys\nprint('partial')\nsys.exit(3)"))[0]
    assert obs[0]["content"].startswith("Error: exit status 3.") and "partial" in obs[0]["content"]
    obs = env.step(_py("1/0"))[0]
    assert "ZeroDivisionError" in obs[0]["content"] and "exit status 1" in obs[0]["content"]
    obs = env.step(_py("x = 1"))[0]
    assert obs[0]["content"].startswith("(no output")
    obs = env.step(_py("open('notes.txt', 'w').write('kept')"))[0]
    assert env.step(_py("print(open('notes.txt').read())"))[0][0]["content"] == "kept\n"
    env.reset(seed=0)  # a new episode gets a new sandbox
    obs = env.step(_py("import os\nprint(os.path.exists('notes.txt'))"))[0]
    assert obs[0]["content"] == "False\n"
    env.close()


def test_sympy_is_importable_in_the_local_sandbox(local_backend):
    env = MathTIREnv(sandbox=local_backend)
    obs, _ = env.reset(seed=0)
    assert "sympy" in obs[0]["content"]
    out = env.step(_py("import sympy\nprint(sympy.factor('x**2 - 1'))"))[0][0]["content"]
    assert out == "(x - 1)*(x + 1)\n"
    bare = MathTIREnv(sandbox=local_backend, sandbox_packages=())
    assert "sympy" not in bare.reset(seed=0)[0][0]["content"]
    assert "ModuleNotFoundError" in bare.step(_py("import sympy"))[0][0]["content"]
    env.close()
    bare.close()


@pytest.mark.slow
def test_hostile_code_gets_bounded_errors_and_the_env_stays_usable(backend, tmp_path):
    env = MathTIREnv(sandbox=backend, python_timeout_s=1.5, max_output_chars=2000)
    env.reset(seed=0)
    outside = tmp_path / "escaped.txt"
    hostile = {
        "infinite loop": ("while True:\n    pass", "ran longer than 1.5 s"),
        "fork bomb": ("import os\nwhile True:\n    os.fork()", "Error"),
        "network": ("import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=1)",
                    "Error"),
        "write outside the workdir": (f"open('/etc/x', 'w')\nopen('{outside}', 'w')",
                                      "Read-only file system"),
        "huge output": ("print('x' * 50_000_000)", "truncated"),
        # killed by the memory limit, or by the clock where OOM is slow to come (docker cgroup)
        "memory hog": ("x = b'x' * (8 << 30)", ("memory", "ran longer than")),
        "invalid utf-8 output": ("import sys\nsys.stdout.buffer.write(b'\\xff\\xfe\\n')",
                                 "\ufffd"),
        "kill the parent": ("import os\nos.kill(1, 9)\nos.kill(os.getppid(), 9)", ""),
    }
    for name, (code, expected) in hostile.items():
        start = time.perf_counter()
        obs, reward, term, trunc, _ = env.step(_py(code))
        content = obs[0]["content"]
        assert any(e in content for e in ((expected,) if isinstance(expected, str)
                                          else expected)), (name, content[:300])
        assert len(content) <= 2000 + 200, name
        assert (reward, term, trunc) == (0.0, False, False), name
        assert time.perf_counter() - start < 15, name
        json.dumps(obs)
        assert env.step(_py("print(6 * 7)"))[0][0]["content"] == "42\n", f"unusable after {name}"
    assert not outside.exists()
    env.close()


def test_env_specific_hostile_actions():
    env = MathTIREnv(max_code_chars=1000)
    env.reset(seed=0)
    content = env.step(_py("x" * 5000))[0][0]["content"]
    assert content.startswith("Error: python:") and "longer than 1000" in content
    assert env.step(_py("   "))[0][0]["content"] == "Error: python: code is empty"
    obs, reward, term, _, _ = env.step("I think it is \\boxed{12")  # unbalanced: not an answer
    assert (term, reward) == (False, 0.0) and obs[0]["content"].startswith("Error: no tool call")
    obs, reward, term, _, info = env.step(_submit("9" * 1_000_000))
    assert (reward, term, info["grading"]["method"]) == (0.0, True, "too_long")
    env.reset(seed=0)
    obs, reward, term, _, info = env.step(_submit("\ud800\x00"))
    assert (reward, term) == (0.0, True)
    env.reset(seed=0)
    obs, reward, term, _, info = env.step(_submit("   "))
    assert (reward, term, info["reward_components"]["format"]) == (0.0, True, 0.0)
    env.close()


# ----- infrastructure failures -------------------------------------------------------------------
class _BrokenSandbox:
    def __init__(self, fail_at: str):
        self.fail_at, self.closed, self.limits = fail_at, False, None

    async def start(self):
        if self.fail_at == "start":
            raise SandboxUnavailable("no bubblewrap here")

    async def run(self, *args, **kwargs):
        raise SandboxCrashed("the sandbox died")

    async def aclose(self):
        self.closed = True


@pytest.mark.parametrize("fail_at", ["start", "run"])
async def test_sandbox_failures_are_infra_failures(monkeypatch, fail_at):
    made = []

    def fake_make_sandbox(spec):
        made.append(_BrokenSandbox(fail_at))
        return made[-1]

    monkeypatch.setattr("sao_gym.envs.math_tir.env.make_sandbox", fake_make_sandbox)
    # start_sandbox's builder:
    monkeypatch.setattr("sao_gym.sandbox.factory.make_sandbox", fake_make_sandbox)
    env = sao_gym.make(ENV_ID)
    rollout = await sao_gym.run_episode(env, ScriptedAgent([_py("print(1)")]), seed=0)
    assert rollout.infra_failure and rollout.stop_reason is StopReason.ENV_ERROR
    assert not rollout.terminated and rollout.reward == 0.0
    await env.aclose()
    assert len(made) == 2 and made[-1].closed  # [0]: the spec check at construction


# ----- the checker, seeding, options -------------------------------------------------------------
@pytest.mark.slow
def test_check_agent_env_passes():
    env = sao_gym.make(ENV_ID)
    assert len(check_agent_env(env)) == 7


def test_tasks_are_chosen_by_seed_and_options():
    env = sao_gym.make(ENV_ID)
    obs_a, info_a = env.reset(seed=7)
    task_a = dict(env.unwrapped.task)
    obs_b, _ = env.reset(seed=7)
    assert obs_a == obs_b and env.unwrapped.task == task_a and info_a["task_id"] == task_a["id"]
    assert task_a["answer"] not in json.dumps(obs_a[0])  # the system prompt reveals nothing
    assert len({env.reset(seed=s)[1]["task_id"] for s in range(20)}) == 20
    env.reset(options={"generator": "chain_sum", "index": 5})
    assert env.unwrapped.task["id"] == "rg:chain_sum:0:5"
    same = ReasoningGymTasks(["chain_sum"]).task("chain_sum", 5)
    assert env.unwrapped.task["prompt"] == same["prompt"]
    obs, _ = env.reset(options={"task": {"prompt": "What is 6*7?", "answer": "42"}})
    assert obs[1] == {"role": "user", "content": "What is 6*7?"}
    assert env.step(_submit("42"))[1] == 1.0
    for bad in [{"task": {"prompt": "no answer"}}, {"task": "2+2"}, {"generator": "nope"},
                {"generator": "chain_sum", "index": -1}, {"index": "3"}]:
        with pytest.raises(ValueError):
            env.reset(options=bad)
    env.close()


def test_generator_configs_and_data_seed():
    a = MathTIREnv(generators=["chain_sum"], generator_configs={"chain_sum": {"min_terms": 5,
                                                                              "max_terms": 5}})
    a.reset(seed=0)
    assert a.unwrapped.task["prompt"].count("+") + a.unwrapped.task["prompt"].count("-") >= 4
    b = MathTIREnv(generators=["chain_sum"], data_seed=1)
    c = MathTIREnv(generators=["chain_sum"], data_seed=2)
    b.reset(seed=0)
    c.reset(seed=0)
    assert b.task["prompt"] != c.task["prompt"]


@pytest.mark.parametrize("kwargs, match", [
    ({"generators": ["gsm_symbolc"]}, "did you mean gsm_symbolic"),
    ({"generators": []}, "non-empty"),
    ({"generators": "chain_sum"}, "non-empty"),
    ({"generator_configs": {"countdown": {}}}, "not in use"),
    ({"generators": ["chain_sum"], "generator_configs": {"chain_sum": {"bogus": 1}}}, "config"),
    ({"python_timeout_s": 0}, "python_timeout_s"),
    ({"python_timeout_s": "10"}, "python_timeout_s"),
    ({"verify_timeout_s": -1}, "verify_timeout_s"),
    ({"format_weight": 2.0}, "format_weight"),
    ({"max_output_chars": 10}, "max_output_chars"),
    ({"plain_text": "ignore"}, "plain_text"),
    ({"sandbox": "vm"}, "unknown sandbox backend"),
    ({"sandbox": {"backend": "local", "limits": {"ram": 1}}}, "unknown sandbox limits"),
    ({"sandbox": 3}, "sandbox must be"),
    ({"sandbox_packages": ["no_such_package_xyz"]}, "not installed"),
    ({"sandbox_packages": "sympy"}, "list of package names"),
    ({"data_files": "/nonexistent/gsm8k.jsonl"}, "does not exist"),
    ({"system_prompt": ""}, "system_prompt"),
])
def test_bad_constructor_input_raises_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MathTIREnv(**kwargs)


def test_plain_text_modes_and_format_weight():
    task = {"task": {"prompt": "What is 6*7?", "answer": "42"}}
    env = MathTIREnv()
    env.reset(options=task)
    obs, reward, term, _, info = env.step("It is 42.")
    assert (reward, term, info["invalid_action"]) == (0.0, False, True)
    grading = MathTIREnv(plain_text="grade", format_weight=0.2)
    grading.reset(options=task)
    obs, reward, term, _, info = grading.step("After checking, the result is 42.")
    assert term and info["reward_components"] == {"correctness": 1.0, "format": 0.0}
    assert reward == pytest.approx(0.8)
    grading.reset(options=task)
    obs, reward, term, _, info = grading.step(_submit("41"))
    assert reward == pytest.approx(0.2) and info["reward_components"]["format"] == 1.0


# ----- data files --------------------------------------------------------------------------------
def _write_jsonl(path, records, gz=False):
    text = "".join(json.dumps(r) + "\n" for r in records)
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text + "\n")


def test_jsonl_gsm8k_and_math_files(tmp_path):
    gsm = tmp_path / "gsm8k.jsonl"
    _write_jsonl(gsm, [
        {"question": "Tom has 3 bags of 4 apples. How many apples?", "answer": "3*4=12\n#### 12"},
        {"question": "A shop sells 1,000 pens a day. Pens in 3 days?",
         "answer": "1000*3=3000\n#### 3,000"},
        {"question": "No final answer here", "answer": "just reasoning"},
    ])
    tasks = load_tasks(gsm, answer_format="gsm8k")
    assert [t["answer"] for t in tasks] == ["12", "3000"]  # the third has no #### and is skipped
    math = tmp_path / "math.jsonl.gz"
    _write_jsonl(math, [
        {"uid": "alg-1", "problem": "Solve 2x = 1.", "solution": r"So $x = \boxed{\frac{1}{2}}$."},
        {"uid": "alg-2", "problem": "What is $\\sqrt{16}$?", "solution": r"It is $\boxed{4}$."},
    ], gz=True)
    env = MathTIREnv(data_files=math, question_key="problem", answer_key="solution",
                     id_key="uid")
    obs, info = env.reset(seed=3)
    assert info["task_id"] in {"alg-1", "alg-2"} and obs[1]["content"] == env.task["prompt"]
    env.reset(seed=3)
    assert env.task["id"] == info["task_id"]
    env.reset(options={"index": 0})
    assert env.task["answer"] == r"\frac{1}{2}"
    assert env.step(_submit("0.5"))[1] == 1.0
    env.reset(options={"index": 0})
    assert env.step(_submit("1/3"))[1] == 0.0
    env.reset(options={"index": 1})
    assert env.step("The square root is \\boxed{4}.")[1] == 1.0
    env.close()


def test_data_file_errors(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": "1"}\n{not json\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not valid JSON"):
        load_tasks(bad)
    cols = tmp_path / "cols.jsonl"
    _write_jsonl(cols, [{"problem": "q", "solution": "1"}])
    with pytest.raises(ValueError, match="no 'question' column"):
        load_tasks(cols)
    empty = tmp_path / "empty.jsonl"
    _write_jsonl(empty, [{"question": "q", "answer": "no box"}])
    with pytest.raises(ValueError, match="no usable"):
        load_tasks(empty, answer_format="boxed")
    with pytest.raises(ValueError, match="index"):
        env = MathTIREnv(data_files=cols, question_key="problem", answer_key="solution")
        env.reset(options={"index": 5})


def test_parquet_without_datasets_gives_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if not installed (TRL brings it)
    path = tmp_path / "train.parquet"
    path.write_bytes(b"PAR1")
    with pytest.raises(ImportError, match=r"pip install datasets.*JSONL"):
        load_tasks(path)


def test_gymnasium_make_works_too():
    import gymnasium

    assert ENV_ID in sao_gym.env_ids()
    env = gymnasium.make(ENV_ID)
    env.reset(options={"task": {"prompt": "What is 2+2?", "answer": "4"}})
    assert env.step(_submit(4))[1:3] == (1.0, True)
    env.close()


@pytest.mark.parametrize("module", ["safe_parse", "data"])
def test_docstring_examples(module):
    import doctest

    mod = importlib.import_module(f"sao_gym.envs.math_tir.{module}")
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
