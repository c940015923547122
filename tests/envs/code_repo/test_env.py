"""sao_gym/CodeRepo-v0 end to end: real bubblewrap sandboxes, real git, hidden tests.

Oracle tests over every bundled task live in tests/envs/code_repo/test_tasks.py;
the test runner and grading rules in tests/envs/code_repo/test_testrunner.py.
"""

from __future__ import annotations

import json
import subprocess
import textwrap

import gymnasium
import pytest

import sao_gym
from sao_gym.cli import main as cli_main
from sao_gym.envs.code_repo import CodeRepoEnv, RepoTask, swe
from sao_gym.envs.code_repo.sources import load_tasks
from sao_gym.envs.code_repo.tasks import read_jsonl, unified_diff
from sao_gym.sandbox import SandboxError, SandboxUnavailable
from sao_gym.types import StopReason
from sao_gym.utils.env_checker import CHECKS, check_agent_env
from tests.helpers import call, calls_msg

ENV_ID = "sao_gym/CodeRepo-v0"
HE_TASK = "humaneval/2"  # truncate_number: one line
BUG_TASKS = ["xmltodict/_emit-56aa82", "isodate/fquotmod-54e1aa", "webcolors/normalize_hex-5c1afc",
             "cachetools/LRUCache.popitem-34c743"]


def act(env, name, args=None):
    """One tool call; returns (text, reward, terminated, truncated, info)."""
    obs, reward, terminated, truncated, info = env.step(calls_msg(call(name, args or {})))
    return obs[0]["content"], reward, terminated, truncated, info


def apply_reference(env):
    patch = env.unwrapped.task["reference_patch"]
    assert act(env, "write_file", {"path": "ref.diff", "content": patch})[0].startswith("Wrote")
    text = act(env, "bash", {"command": "git apply ref.diff && rm ref.diff && git status "
                                        "--short"})[0]
    assert text.startswith("exit code 0"), text


@pytest.fixture
def env():
    e = sao_gym.make(ENV_ID, max_context_tokens=None)
    yield e
    e.close()


# ----- registration, construction, task choice --------------------------------------------
def test_registration():
    assert ENV_ID in sao_gym.env_ids()
    assert gymnasium.spec(ENV_ID).max_episode_steps == 50
    env = sao_gym.make(ENV_ID, tasks="humaneval")
    assert isinstance(env.unwrapped, CodeRepoEnv) and len(env.unwrapped.tasks) == 164
    env.close()


@pytest.mark.slow
def test_check_agent_env_passes():
    assert check_agent_env(sao_gym.make(ENV_ID)) == list(CHECKS)


@pytest.mark.parametrize("kwargs, match", [
    ({"tasks": "nope"}, "tasks must be"),
    ({"tasks": []}, "no tasks"),
    ({"tasks": [{"foo": 1}]}, "neither bug-task records"),
    ({"sandbox": "podman"}, "unknown sandbox backend"),
    ({"sandbox": 42}, "sandbox must be"),
    ({"sandbox": {"backend": "local", "limits": {"bogus": 1}}}, "unknown sandbox limits"),
    ({"command_timeout_s": 0}, "command_timeout_s"),
    ({"test_timeout_s": -1}, "test_timeout_s"),
    ({"max_context_tokens": 10}, "max_context_tokens"),
    ({"max_output_chars": 5}, "max_output_chars"),
    ({"max_file_bytes": 0}, "max_file_bytes"),
])
def test_bad_constructor_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CodeRepoEnv(**kwargs)


def test_task_choice_by_seed_id_index_and_record():
    env = CodeRepoEnv(tasks="all")
    assert len(env.tasks) == 164 + 64
    env.reset(seed=7)
    first = env.task
    env.reset(seed=7)
    assert env.task == first
    ids = set()
    for seed in range(12):
        env.reset(seed=seed)
        ids.add(env.task["id"])
    assert len(ids) >= 8
    env.reset(options={"task": HE_TASK})
    assert env.task["id"] == HE_TASK and env.task["FAIL_TO_PASS"] == [
        "tests/test_hidden.py::test_check"]
    assert set(env.task) >= {"id", "prompt", "reference_patch", "FAIL_TO_PASS", "PASS_TO_PASS"}
    env.reset(options={"task": 0})
    assert env.task["id"] == "humaneval/0"
    for bad in ("no/such-task", 10_000, True, 3.5):
        with pytest.raises(ValueError):
            env.reset(options={"task": bad})
    env.close()


def test_the_prompt_never_shows_the_reference():
    env = CodeRepoEnv(tasks="bugs")
    obs, info = env.reset(options={"task": BUG_TASKS[1]})
    text = json.dumps(obs)
    patch = env.task["reference_patch"]
    added = [line[1:] for line in patch.splitlines() if line.startswith("+ ")]
    assert added and not any(line.strip() in text for line in added if len(line.strip()) > 8)
    assert "reference" not in json.dumps(info)
    env.close()


# ----- oracle episodes through the tools --------------------------------------------------
@pytest.mark.parametrize("task_id", [HE_TASK, "humaneval/121", *BUG_TASKS])
def test_reference_patch_scores_one_and_doing_nothing_zero(env, task_id):
    obs, info = env.reset(options={"task": task_id})
    assert info["task_id"] == task_id
    apply_reference(env)
    text, reward, terminated, truncated, info = act(env, "submit")
    assert (reward, terminated, truncated) == (1.0, True, False), text
    assert info["reward_components"] == {"resolved": 1.0, "fail_to_pass": 1.0,
                                         "pass_to_pass": 1.0}
    assert "solution.py" in info["model_patch"] or "src" in info["model_patch"] or \
        ".py" in info["model_patch"]
    env.reset(options={"task": task_id})
    text, reward, terminated, _, info = act(env, "submit")
    assert (reward, terminated, info["reward_components"]["resolved"]) == (0.0, True, 0.0)
    assert info["reward_components"]["fail_to_pass"] == 0.0
    assert info["failing_tests"][0] == env.unwrapped.task["FAIL_TO_PASS"][0]


def test_repository_is_a_git_repo_and_tools_work(env):
    env.reset(options={"task": HE_TASK})
    text = act(env, "bash", {"command": "git log --oneline | wc -l; git status --short; pwd"})[0]
    assert text == "exit code 0\n1\n/work\n"
    stub = act(env, "read_file", {"path": "solution.py"})[0]
    assert "def truncate_number" in stub
    out = act(env, "str_replace", {"path": "solution.py", "old": '    """\n',
                                   "new": '    """\n    return number % 1.0\n'})[0]
    assert out.startswith("Replaced 1 occurrence in solution.py")
    assert "return number % 1.0" in act(env, "bash", {"command": "git diff"})[0]
    report = act(env, "run_tests")[0]
    assert report.startswith("1 passed"), report
    assert act(env, "submit")[1] == 1.0


def test_run_tests_shows_failures_and_counts(env):
    env.reset(options={"task": BUG_TASKS[1]})  # isodate
    report = act(env, "run_tests")[0]
    n_fail = len(env.unwrapped.task["FAIL_TO_PASS"])
    n_pass = len(env.unwrapped.task["PASS_TO_PASS"])
    assert report.startswith(f"{n_pass} passed, {n_fail} failed"), report[:200]
    assert "FAILED tests/" in report and "Traceback" in report
    assert len(report) <= env.unwrapped.max_output_chars + 100


def test_humaneval_without_examples_reports_no_tests(env):
    task = next(t for t in load_tasks("humaneval") if not t.metadata["visible_examples"])
    env.reset(options={"task": task.id})
    assert act(env, "run_tests")[0].startswith("No test files")
    act(env, "write_file", {"path": "tests/test_mine.py",
                            "content": "from solution import *\n\ndef test_a():\n    pass\n"})
    assert act(env, "run_tests")[0].startswith("1 passed")


# ----- hostile actions ---------------------------------------------------------------------
@pytest.mark.slow
def test_hostile_commands_are_contained():
    env = sao_gym.make(ENV_ID, command_timeout_s=3, max_context_tokens=None)
    env.reset(options={"task": HE_TASK})
    text, _, terminated, truncated, _ = act(env, "bash", {"command": "while true; do :; done"})
    assert text.startswith("Error: the command timed out after 3 s") and not terminated
    text = act(env, "bash", {"command": ":(){ :|:& };:; sleep 10"})[0]
    assert "timed out" in text or "Resource temporarily unavailable" in text
    # the sandbox is still usable afterwards
    assert act(env, "bash", {"command": "echo alive"})[0] == "exit code 0\nalive\n"
    text = act(env, "bash", {"command": "yes | head -c 5000000"})[0]
    assert "characters cut" in text and len(text) < 9000
    assert act(env, "bash", {"command": "x" * 200_000})[0].startswith(
        "Error: bash: command is 200000 characters long")
    assert act(env, "bash", {"command": "cat /etc/shadow; ls /root"})[0].startswith("exit code ")
    text = act(env, "bash", {"command": "curl -s http://127.0.0.1:1 || "
                                        "python3 -c 'import socket; socket.create_connection("
                                        "(\"1.1.1.1\", 80), timeout=2)'"})[0]
    assert not text.startswith("exit code 0")
    env.close()


def test_hostile_file_operations(env):
    env.reset(options={"task": HE_TASK})
    for path in ("../../etc/passwd", "/etc/passwd", "/work/../etc/passwd"):
        text = act(env, "read_file", {"path": path})[0]
        assert text.startswith("Error: read_file:") and "outside" in text, text
        text = act(env, "write_file", {"path": path, "content": "x"})[0]
        assert text.startswith("Error: write_file:") and "outside" in text, text
    text = act(env, "write_file", {"path": "big.txt", "content": "x" * (1 << 20)})[0]
    assert text == "Error: write_file: content is 1048576 bytes; files are limited to 262144 bytes"
    big_patch = "--- a/solution.py\n+++ b/solution.py\n" + "+x\n" * 400_000
    text = act(env, "write_file", {"path": "p.diff", "content": big_patch})[0]
    assert text.startswith("Error: write_file: content is")
    text = act(env, "str_replace", {"path": "solution.py", "old": "def", "new": "x" * 300_000})[0]
    assert "files are limited" in text or "occurs" in text
    act(env, "bash", {"command": "ln -s /etc/passwd link && mkdir d"})
    assert "symlink" in act(env, "read_file", {"path": "link"})[0]
    assert "symlink" in act(env, "write_file", {"path": "link", "content": "x"})[0]
    assert act(env, "read_file", {"path": "d"})[0].startswith("Error: read_file: d:")
    assert act(env, "read_file", {"path": "nope.py"})[0] == \
        "Error: read_file: nope.py: no such file"
    assert act(env, "read_file", {"path": ""})[0] == "Error: read_file: path is empty"
    assert "not found" in act(env, "str_replace", {"path": "solution.py", "old": "zzz",
                                                   "new": "y"})[0]
    assert "occurs" in act(env, "str_replace", {"path": "solution.py", "old": "number",
                                                "new": "n"})[0]
    assert "empty" in act(env, "str_replace", {"path": "solution.py", "old": "", "new": "y"})[0]
    # reads of huge files are cut
    act(env, "bash", {"command": "seq 1 100000 > many.txt"})
    text = act(env, "read_file", {"path": "many.txt"})[0]
    assert len(text) < 9000 and "sed -n" in text


@pytest.mark.slow
def test_deleting_or_forging_tests_does_not_fool_the_grader(env):
    env.reset(options={"task": HE_TASK})
    forged = "def test_check():\n    pass\n"
    act(env, "write_file", {"path": "tests/test_hidden.py", "content": forged})
    act(env, "write_file", {"path": "conftest.py", "content": "import pytest\n"
                            "@pytest.fixture(autouse=True)\ndef f():\n    pass\n"})
    act(env, "write_file", {"path": "tests/conftest.py", "content": "raise SystemExit\n"})
    # imitate the runner's report lines (without the run's nonce) at import time
    act(env, "bash", {"command": "echo 'print(\"0123abcd {\\\"id\\\": "
                                 "\\\"tests/test_hidden.py::test_check\\\", \\\"outcome\\\": "
                                 "\\\"passed\\\"}\")' >> solution.py && mkdir -p __pycache__"})
    text, reward, *_ = act(env, "submit")
    assert reward == 0.0, text
    # a pytest.py whose raises() passes without an exception does not replace ours
    tests = {"tests/test_sqrt.py": "import pytest\n\nfrom root import sqrt\n\n\n"
                                   "def test_negative():\n    with pytest.raises(ValueError):\n"
                                   "        sqrt(-1)\n"}
    task = RepoTask(id="sqrt", prompt="sqrt(-1) must raise ValueError",
                    files={"root.py": "def sqrt(x):\n    return abs(x) ** 0.5\n", **tests},
                    hidden_tests=tests, fail_to_pass=("tests/test_sqrt.py::test_negative",),
                    pass_to_pass=(), reference_patch="", source="custom")
    custom = CodeRepoEnv(tasks=[task])
    custom.reset()
    assert act(custom, "run_tests")[0].startswith("1 failed")
    act(custom, "write_file", {"path": "pytest.py", "content": (
        "import contextlib\n\ndef raises(*a, **k):\n    return contextlib.suppress()\n")})
    assert act(custom, "run_tests")[0].startswith("1 failed")
    assert act(custom, "submit")[1] == 0.0
    custom.close()
    # a bug task: the agent deletes the whole test suite, fixes the bug, submits
    env.reset(options={"task": BUG_TASKS[0]})
    act(env, "bash", {"command": "rm -rf tests"})
    apply_reference(env)
    text, reward, _, _, info = act(env, "submit")
    assert reward == 1.0, text
    assert info["metrics"]["pass_to_pass_passed"] == len(env.unwrapped.task["PASS_TO_PASS"])
    # ... and without the fix the restored tests fail, even if the agent locked them away
    env.reset(options={"task": BUG_TASKS[0]})
    act(env, "bash", {"command": "echo 'def test_x(): pass' > tests/test_dicttoxml.py && "
                                 "chmod -R 000 tests"})
    assert act(env, "submit")[1] == 0.0
    env.reset(options={"task": BUG_TASKS[0]})
    apply_reference(env)
    act(env, "bash", {"command": "chmod -R 000 tests"})
    assert act(env, "submit")[1] == 1.0


def test_long_horizon_limits():
    env = sao_gym.make(ENV_ID, max_episode_steps=3, max_context_tokens=None)
    env.reset(options={"task": HE_TASK})
    assert act(env, "bash", {"command": "true"})[3] is False
    assert act(env, "bash", {"command": "true"})[3] is False
    *_, truncated, info = act(env, "bash", {"command": "true"})
    assert truncated and info["stop_reason"] == StopReason.MAX_TURNS
    env.close()
    env = sao_gym.make(ENV_ID, max_context_tokens=2000)
    env.reset(options={"task": HE_TASK})
    _, _, terminated, truncated, info = act(env, "bash", {"command": "echo small"})
    assert not truncated and 0 < info["metrics"]["context_tokens"] < 2000
    obs, _, terminated, truncated, info = env.step(calls_msg(call(
        "bash", {"command": "seq 1 3000"})))
    assert truncated and not terminated and info["stop_reason"] == StopReason.MAX_TOKENS
    assert "budget" in obs[-1]["content"]
    env.close()


def test_partial_credit():
    files = {"calc.py": "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a + b\n\n"
             "\ndef neg(a):\n    return -a\n"}
    tests = {"tests/test_calc.py": "from calc import add, mul, neg\n\n"
             "def test_add():\n    assert add(2, 3) == 5\n\n"
             "def test_mul():\n    assert mul(2, 3) == 6\n\n"
             "def test_neg():\n    assert neg(2) == -2\n"}
    fixed = files["calc.py"].replace("a - b", "a + b").replace("return a + b\n\n\ndef neg",
                                                               "return a * b\n\n\ndef neg")
    task = RepoTask(
        id="calc", prompt="fix calc", files={**files, **tests}, hidden_tests=tests,
        fail_to_pass=("tests/test_calc.py::test_add", "tests/test_calc.py::test_mul"),
        pass_to_pass=("tests/test_calc.py::test_neg",),
        reference_patch=unified_diff("calc.py", files["calc.py"], fixed), source="custom")
    env = CodeRepoEnv(tasks=[task], partial_credit=True)
    env.reset()
    act(env, "str_replace", {"path": "calc.py", "old": "a - b", "new": "a + b"})
    text, reward, _, _, info = act(env, "submit")
    assert reward == pytest.approx(0.5) and "FAIL_TO_PASS: 1/2" in text
    assert info["reward_components"] == {"resolved": 0.0, "fail_to_pass": 0.5,
                                         "pass_to_pass": 1.0}
    env.reset()
    act(env, "write_file", {"path": "calc.py", "content": fixed.replace("-a", "a")})
    assert act(env, "submit")[1] == pytest.approx(1.0 * 0.0)  # broke the PASS_TO_PASS test
    env.reset()
    apply_reference(env)
    assert act(env, "submit")[1] == 1.0
    env.close()
    strict = CodeRepoEnv(tasks=[task])
    strict.reset()
    act(strict, "str_replace", {"path": "calc.py", "old": "a - b", "new": "a + b"})
    assert act(strict, "submit")[1] == 0.0
    strict.close()


def test_sandbox_failures_are_infra_errors(monkeypatch):
    env = CodeRepoEnv(tasks="humaneval")
    env.reset(options={"task": HE_TASK})
    sandbox = env._sandbox
    env._sync.run(sandbox.aclose())  # the sandbox dies under the episode
    with pytest.raises(SandboxError):
        act(env, "bash", {"command": "true"})
    env.close()
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/sao-gym-no-docker.sock")
    docker_env = CodeRepoEnv(tasks="humaneval", sandbox="docker")
    with pytest.raises(SandboxUnavailable):
        docker_env.reset(options={"task": HE_TASK})
    docker_env.close()


# ----- SWE-bench style instances ------------------------------------------------------------
def _git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True, env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                                          "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
                                          "HOME": str(repo), "PATH": "/usr/bin:/bin"}).stdout


def make_instance(tmp_path, runner="builtin"):
    """A fabricated SWE-bench instance: a local git repository, a fix and a test patch."""
    repo = tmp_path / "repo"
    (repo / "mathlib").mkdir(parents=True)
    (repo / "tests").mkdir()
    buggy = "def clamp(x, lo, hi):\n    return max(lo, min(x, lo))\n"
    (repo / "mathlib" / "__init__.py").write_text(buggy)
    old_tests = ("from mathlib import clamp\n\n\n"
                 "def test_low():\n    assert clamp(-5, 0, 10) == 0\n")
    (repo / "tests" / "test_clamp.py").write_text(old_tests)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    base = _git(repo, "rev-parse", "HEAD").strip()
    new_tests = old_tests + "\n\ndef test_high():\n    assert clamp(50, 0, 10) == 10\n\n\n" \
                            "def test_mid():\n    assert clamp(5, 0, 10) == 5\n"
    instance = {
        "instance_id": "local__mathlib-1", "repo": "local/mathlib", "base_commit": base,
        "patch": unified_diff("mathlib/__init__.py", buggy, buggy.replace("x, lo))", "x, hi))")),
        "test_patch": unified_diff("tests/test_clamp.py", old_tests, new_tests),
        "problem_statement": "clamp() ignores its upper bound.",
        "FAIL_TO_PASS": json.dumps(["tests/test_clamp.py::test_high",
                                    "tests/test_clamp.py::test_mid"]),
        "PASS_TO_PASS": ["tests/test_clamp.py::test_low"],
        "host_repo": str(repo), "runner": runner, "version": "0.1",
    }
    return instance


def test_swe_instance_parsing(tmp_path):
    inst = make_instance(tmp_path)
    task = swe.task_from_instance({**inst, "host_repo": None, "runner": "pytest"})
    assert task.id == "local__mathlib-1" and task.source == "swe"
    assert task.fail_to_pass == ("tests/test_clamp.py::test_high", "tests/test_clamp.py::test_mid")
    assert task.pass_to_pass == ("tests/test_clamp.py::test_low",)
    assert task.swe.image == "sweb.eval.x86_64.local_1776_mathlib-1:latest"
    assert task.swe.repo_dir == "/testbed" and task.swe.test_cmd == swe.DEFAULT_TEST_CMD
    assert task.test_dirs == ("tests",) and task.metadata["test_files"] == ["tests/test_clamp.py"]
    assert "clamp() ignores its upper bound." in task.prompt and task.files == {}
    assert task.public()["base_commit"] == inst["base_commit"]
    custom = swe.task_from_instance({**inst, "image": "my/image:1", "test_cmd": "pytest {tests}"})
    assert (custom.swe.image, custom.swe.test_cmd) == ("my/image:1", "pytest {tests}")
    for broken, match in [({"FAIL_TO_PASS": "[not json"}, "not a JSON list"),
                          ({"FAIL_TO_PASS": "[]"}, "FAIL_TO_PASS is empty"),
                          ({"PASS_TO_PASS": [1]}, "list of test ids"),
                          ({"runner": "nose"}, "runner must be")]:
        with pytest.raises(ValueError, match=match):
            swe.task_from_instance({**inst, **broken})
    with pytest.raises(ValueError, match="missing field"):
        swe.task_from_instance({k: v for k, v in inst.items() if k != "test_patch"})
    path = tmp_path / "instances.jsonl"
    path.write_text(json.dumps(inst) + "\n" + json.dumps({**inst, "instance_id": "b__c-2"}) + "\n")
    assert [t.id for t in swe.load_swe_instances(path)] == ["local__mathlib-1", "b__c-2"]
    assert [t.id for t in load_tasks(path)] == ["local__mathlib-1", "b__c-2"]


def test_swe_fabricated_instance_end_to_end(tmp_path):
    inst = make_instance(tmp_path)
    env = sao_gym.make(ENV_ID, tasks=[inst], max_context_tokens=None)
    obs, _ = env.reset()
    assert "clamp() ignores its upper bound." in obs[1]["content"]
    assert act(env, "bash", {"command": "git rev-parse HEAD"})[0].split()[-1] == \
        inst["base_commit"]
    report = act(env, "run_tests")[0]
    assert report.startswith("1 passed"), report  # only the base commit's test is visible
    text, reward, _, _, info = act(env, "submit")
    assert reward == 0.0 and info["reward_components"]["pass_to_pass"] == 1.0, text
    env.reset()
    apply_reference(env)
    # tampering with the test file the test patch touches changes nothing
    act(env, "write_file", {"path": "tests/test_clamp.py", "content": "def test_high():\n"
                            "    pass\n\n\ndef test_mid():\n    pass\n"})
    text, reward, _, _, info = act(env, "submit")
    assert reward == 1.0, text
    assert "mathlib/__init__.py" in info["model_patch"]
    env.close()


@pytest.mark.slow
async def test_docker_sandbox_runs_swe_instance_with_pytest_and_humaneval(tmp_path):
    from tests.sandbox.conftest import backend_class

    await backend_class("docker")  # skips without a daemon and the image (unless required)
    inst = make_instance(tmp_path, runner="pytest")
    inst["test_cmd"] = "python3 -m pytest -rA -p no:cacheprovider {tests}"
    env = CodeRepoEnv(tasks=[inst], sandbox="docker")
    await env.areset()
    obs, *_ = await env.astep(calls_msg(call("run_tests", {})))
    assert obs[0]["content"].startswith("1 passed"), obs  # pytest on the base test file
    call_ = calls_msg(call("submit", {}))
    obs, reward, *_ = await env.astep(call_)
    assert reward == 0.0, obs
    await env.areset()
    patch = env.task["reference_patch"]
    await env.astep(calls_msg(call("write_file", {"path": "p.diff", "content": patch})))
    obs, *_ = await env.astep(calls_msg(call("bash", {"command": "git apply p.diff && "
                                                                 "rm p.diff"})))
    assert obs[0]["content"].startswith("exit code 0"), obs
    obs, reward, *_ = await env.astep(call_)
    assert reward == 1.0, obs
    await env.aclose()
    he = CodeRepoEnv(tasks="humaneval", sandbox="docker")
    await he.areset(options={"task": HE_TASK})
    patch = he.task["reference_patch"]
    await he.astep(calls_msg(call("write_file", {"path": "p.diff", "content": patch})))
    await he.astep(calls_msg(call("bash", {"command": "git apply p.diff && rm p.diff"})))
    obs, reward, *_ = await he.astep(call_)
    assert reward == 1.0, obs
    await he.aclose()


# ----- making tasks from a package ------------------------------------------------------------
TINY_PACKAGE = {
    "tinymath/__init__.py": textwrap.dedent('''
        """A tiny package."""


        def clamp(x, lo, hi):
            if x < lo:
                return lo
            if x > hi:
                return hi
            return x


        def mean(values):
            if not values:
                raise ValueError("empty")
            return sum(values) / len(values)


        def is_even(n):
            return n % 2 == 0
    '''),
    "tests/test_tinymath.py": textwrap.dedent('''
        import pytest

        from tinymath import clamp, is_even, mean


        @pytest.mark.parametrize("x, want", [(-1, 0), (5, 5), (11, 10), (0, 0), (10, 10)])
        def test_clamp(x, want):
            assert clamp(x, 0, 10) == want


        def test_mean():
            assert mean([1, 2, 3]) == 2
            with pytest.raises(ValueError):
                mean([])


        def test_is_even():
            assert is_even(4) and not is_even(3)
    '''),
    "LICENSE": "MIT License\n",
    "README.md": "tinymath\n",
}


@pytest.mark.slow
def test_make_code_repo_command(tmp_path, capsys):
    pkg = tmp_path / "tinymath-1.0"
    for path, text in TINY_PACKAGE.items():
        (pkg / path).parent.mkdir(parents=True, exist_ok=True)
        (pkg / path).write_text(text)
    out = tmp_path / "tiny.jsonl"
    code = cli_main(["tasks", "make-code-repo", "--package", str(pkg), "--out", str(out),
                     "--max-tasks", "3", "--seed", "1"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["tasks"] == 3 and report["baseline_tests"] == 7
    records = read_jsonl(out)
    assert records[0]["kind"] == "package" and records[0]["name"] == "tinymath-1.0"
    assert records[0]["source_files"] == ["tinymath/__init__.py"]
    assert [r["kind"] for r in records[1:]] == ["task"] * 3
    env = sao_gym.make(ENV_ID, tasks=str(out), max_context_tokens=None)
    for i in range(3):
        env.reset(options={"task": i})
        assert act(env, "submit")[1] == 0.0
        env.reset(options={"task": i})
        apply_reference(env)
        assert act(env, "submit")[1] == 1.0
    env.close()
    assert cli_main(["tasks", "make-code-repo", "--package", str(tmp_path / "missing"),
                     "--max-tasks", "1"]) == 1
    assert "FAIL" in capsys.readouterr().err
