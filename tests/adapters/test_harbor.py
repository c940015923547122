"""Harbor task directories: export, checked with harbor's own task model and linter.

- Export and the graders' logic run everywhere (the graders on the host, with
  ``python3`` and, for Coq, ``coqc``).
- ``harbor`` (0.25, Python >= 3.12) runs in a scratch venv: exported tasks
  must load with its ``Task`` model and lint clean. A failed venv build fails
  the test with pip's log; no Python >= 3.12 skips it.
- ``HarborTaskEnv`` with the Docker engine: tests/adapters/test_harbor_env.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

import sao_gym
from sao_gym.adapters.harbor import (
    HarborTaskEnv,
    HarborTaskError,
    export_tasks,
    exportable_env_ids,
    load_task,
    select_tasks,
)
from sao_gym.adapters.harbor import export as harbor_export
from sao_gym.adapters.harbor.env import _parse_reward, _sections
from sao_gym.adapters.harbor.task import _tomllib, dump_toml
from sao_gym.cli import main as cli_main
from sao_gym.envs.code_repo import harbor_grade as grade_code
from sao_gym.envs.code_repo.tasks import apply_patch, shipped_bug_tasks
from sao_gym.envs.coq_proof import harbor_grade as grade_coq
from tests.helpers import EchoEnv

try:
    tomllib = _tomllib()  # tomli on Python 3.10
except HarborTaskError as e:
    pytest.skip(str(e), allow_module_level=True)
COQ_IDS = ["and_swap", "double_plus"]


def code_ids() -> list[str]:
    """Two HumanEval problems and one bug of each of three packages."""
    bugs = {}
    for t in shipped_bug_tasks():
        bugs.setdefault(t.id.split("/")[0], t.id)
    return ["humaneval/0", "humaneval/12", bugs["cachetools"], bugs["isodate"],
            bugs["xmltodict"]]


def export_all(out: Path) -> dict[str, list[Path]]:
    """Five CodeRepo tasks and two CoqProof tasks, exported under ``out``."""
    return {"code": export_tasks("sao_gym/CodeRepo-v0", code_ids(), out),
            "coq": export_tasks("CoqProof-v0", COQ_IDS, out)}


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, list[Path]]:
    return export_all(tmp_path_factory.mktemp("harbor"))


def call(name: str, **args) -> dict:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": name,
                                                      "arguments": json.dumps(args)}}]}


# ----- export ----------------------------------------------------------------------------
def test_export_writes_harbor_task_directories(exported):
    code, coq = exported["code"], exported["coq"]
    assert [p.name for p in code[:2]] == ["coderepo-humaneval-0", "coderepo-humaneval-12"]
    assert [p.name for p in coq] == ["coqproof-and_swap", "coqproof-double_plus"]
    for d in code + coq:
        for rel in ("instruction.md", "task.toml", "environment/Dockerfile", "tests/test.sh",
                    "solution/solve.sh"):
            assert (d / rel).is_file(), f"{d.name} lacks {rel}"
        for rel in ("tests/test.sh", "solution/solve.sh"):
            assert os.access(d / rel, os.X_OK), rel
        config = tomllib.loads((d / "task.toml").read_text())
        assert config["schema_version"] == "1.4" and config["artifacts"] == ["/app"]
        assert config["verifier"]["environment_mode"] == "separate"
        assert config["task"]["name"] == f"sao-gym/{d.name}"
        task = load_task(d)
        assert task.separate_verifier and [a.source for a in task.artifacts] == ["/app"]
        assert task.workdir == "/app" and task.agent_timeout_s in (900.0, 1800.0)
    he = code[0]
    assert (he / "environment/repo/solution.py").is_file()
    assert (he / "tests/hidden/tests/test_hidden.py").is_file()
    assert not (he / "environment/repo/tests/test_hidden.py").exists()  # hidden stays hidden
    assert "has_close_elements" in (he / "instruction.md").read_text()
    assert "submit" not in (he / "instruction.md").read_text()  # no env tools in Harbor
    assert "FROM sao-gym-sandbox:latest" in (he / "environment/Dockerfile").read_text()
    assert "git apply" in (he / "solution/solve.sh").read_text()
    spec = json.loads((he / "tests/grading.json").read_text())
    assert spec["fail_to_pass"] == ["tests/test_hidden.py::test_check"]
    assert spec["clear_dirs"] == ["tests"]
    vendored = he / "tests/vendor/sao_gym/envs/code_repo/grading.py"
    assert vendored.read_text() == Path(sao_gym.envs.code_repo.grading.__file__).read_text()
    c = coq[0]
    assert "FROM sao-gym-sandbox-coq:latest" in (c / "environment/Dockerfile").read_text()
    assert (c / "environment/app/Task.v").read_text().startswith("Theorem and_swap")
    assert "/app/proof.v" in (c / "instruction.md").read_text()
    assert "reference_proof" not in (c / "tests/task.json").read_text()


def test_export_errors_are_clear(tmp_path, exported):
    with pytest.raises(ValueError, match="supports sao_gym/CodeRepo-v0 and "
                                         "sao_gym/CoqProof-v0, not 'sao_gym/Arithmetic-v0'"):
        export_tasks("sao_gym/Arithmetic-v0", [0], tmp_path)
    with pytest.raises(ValueError, match=r"unknown task id 'humaneval/9999'.*did you mean"):
        export_tasks("sao_gym/CodeRepo-v0", ["humaneval/9999"], tmp_path)
    with pytest.raises(ValueError, match="unknown task id 'no_such_theorem'"):
        export_tasks("sao_gym/CoqProof-v0", ["no_such_theorem"], tmp_path)
    with pytest.raises(ValueError, match="exists"):
        export_tasks("sao_gym/CoqProof-v0", ["and_swap"], exported["coq"][0].parent)
    assert list(tmp_path.iterdir()) == []


class _ListedTasks(EchoEnv):
    tasks = [SimpleNamespace(id="a/1"), SimpleNamespace(id="b 2")]


def _write_stub(env, task, out: Path, name: str) -> None:
    harbor_export.write_text(out / "task.toml", harbor_export.task_toml(
        env.spec.id, task.id, name, "stub", [], {}, agent_s=1, verifier_s=1, memory_mb=1))


def test_any_env_with_a_harbor_hook_exports(tmp_path):
    """The exporter is the env's registered hook: no list of envs in the adapter."""
    sao_gym.register("tests/Listed-v0", _ListedTasks, hooks={"harbor": _write_stub})
    sao_gym.register("tests/Unlisted-v0", _ListedTasks)
    try:
        assert "tests/Listed-v0" in exportable_env_ids()
        assert "tests/Unlisted-v0" not in exportable_env_ids()
        dirs = export_tasks("tests/Listed-v0", None, tmp_path, count=2)
        assert [d.name for d in dirs] == ["listed-a-1", "listed-b-2"]
        meta = tomllib.loads((dirs[1] / "task.toml").read_text())["metadata"]["sao_gym"]
        assert (meta["env_id"], meta["task_id"]) == ("tests/Listed-v0", "b 2")
        with pytest.raises(ValueError, match=r"supports .*tests/Listed-v0.*, not "
                                             r"'tests/Unlisted-v0' \(an env exports"):
            export_tasks("tests/Unlisted-v0", None, tmp_path, count=1)
        with pytest.raises(ValueError, match="not 'tests/Nowhere-v0'"):
            export_tasks("tests/Nowhere-v0", None, tmp_path, count=1)
    finally:
        sao_gym.registration.unregister("tests/Listed-v0")
        sao_gym.registration.unregister("tests/Unlisted-v0")


def test_seeds_export_the_task_that_reset_picks(tmp_path):
    env = sao_gym.make("sao_gym/CoqProof-v0").unwrapped
    picked = [env.reset(seed=s)[1]["task_id"] for s in (3, 4, 5)]
    assert [t.id for t in select_tasks(env, [3, 4, 5], None)] == picked
    assert [t.id for t in select_tasks(env, None, 2)] == [t.id for t in env.tasks[:2]]
    env.close()
    dirs = export_tasks("sao_gym/CoqProof-v0", [3], tmp_path)
    assert dirs == [tmp_path / f"coqproof-{picked[0]}"]


def test_cli_export_harbor(tmp_path, capsys):
    assert cli_main(["export", "harbor", "sao_gym/CoqProof-v0", "--count", "2",
                     str(tmp_path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["tasks"]) == 2 and all(Path(p).is_dir() for p in out["tasks"])
    assert cli_main(["export", "harbor", "sao_gym/MathTIR-v0", "--count", "1",
                     str(tmp_path)]) == 2
    assert "supports sao_gym/CodeRepo-v0" in capsys.readouterr().err
    assert cli_main(["export", "harbor", "sao_gym/CoqProof-v0", "--tasks", "nope",
                     str(tmp_path)]) == 2
    assert "unknown task id 'nope'" in capsys.readouterr().err


def test_dump_toml_round_trips():
    data = {"schema_version": "1.4", "artifacts": ["/app", 'a "q"'], "x": 1.5, "b": False,
            "task": {"name": "a/b", "keywords": []},
            "metadata": {"sao_gym": {"weird key": "é\n\t\\"}}, "agent": {}}
    assert tomllib.loads(dump_toml(data)) == data


def test_load_task_rejects_what_it_cannot_run(tmp_path, exported):
    task = tmp_path / "t"
    shutil.copytree(exported["coq"][0], task)
    config = (task / "task.toml").read_text()
    (task / "task.toml").write_text(config + '\n[[steps]]\nname = "one"\n')
    with pytest.raises(HarborTaskError, match="multi-step"):
        load_task(task)
    (task / "task.toml").write_text(config.replace('workdir = "/app"',
                                                   'workdir = "/app"\nos = "windows"'))
    with pytest.raises(HarborTaskError, match="only Linux"):
        load_task(task)
    (task / "task.toml").write_text(config)
    (task / "tests/test.sh").unlink()
    with pytest.raises(HarborTaskError, match="no tests/test.sh"):
        load_task(task)
    with pytest.raises(HarborTaskError, match="no task.toml"):
        load_task(tmp_path)
    with pytest.raises(ValueError, match="exactly one of task_dir"):
        HarborTaskEnv()


def test_reward_files_are_parsed_strictly():
    assert _parse_reward(None, "1\n") == (1.0, "")
    assert _parse_reward('{"reward": 0.5, "other": 2}', "1") == (0.5, "")
    assert _parse_reward('{"score": 0.25}', None) == (0.25, "")
    assert _parse_reward(None, None)[1].startswith("The tests wrote no reward file")
    assert "does not hold a number" in _parse_reward(None, "yes")[1]
    assert "non-finite" in _parse_reward(None, "nan")[1]
    assert "not valid JSON" in _parse_reward("{", None)[1]
    nonce = "abc123"
    text = (f"{nonce} /logs/verifier/reward.txt\n0\n\n{nonce} /logs/verifier/test-stdout.txt\n"
            "== /logs/verifier/reward.txt\n1\n")  # forged headers in the output do not count
    assert _sections(text, nonce) == {"/logs/verifier/reward.txt": "0\n",
                                      "/logs/verifier/test-stdout.txt":
                                      "== /logs/verifier/reward.txt\n1"}


def test_graders_score_on_the_host(tmp_path, monkeypatch, exported):
    """The in-container graders, run here: the buggy repository 0, the patched one 1."""
    monkeypatch.setattr(grade_code, "VERIFIER_DIR", tmp_path / "verifier")
    task_dir = exported["code"][2]  # a cachetools bug
    env = sao_gym.make("sao_gym/CodeRepo-v0").unwrapped
    task = env._by_id[load_task(task_dir).config["metadata"]["sao_gym"]["task_id"]]
    env.close()
    for files, want in ((task.files, "0"), (apply_patch(task.files, task.reference_patch), "1")):
        repo = tmp_path / f"repo{want}"
        for path, text in files.items():
            (repo / path).parent.mkdir(parents=True, exist_ok=True)
            (repo / path).write_text(text)
        assert grade_code.main(["grade.py", str(task_dir / "tests/grading.json"),
                                str(repo)]) == 0
        assert (tmp_path / "verifier/reward.txt").read_text().strip() == want
    graded = json.loads((tmp_path / "verifier/grading.json").read_text())
    assert graded["resolved"] == 1.0 and graded["failing_tests"] == []
    if shutil.which("coqc") is None:
        pytest.skip("coqc is not installed here (apt-get install coq)")
    monkeypatch.setattr(grade_coq, "VERIFIER_DIR", tmp_path / "coq")
    spec = exported["coq"][1] / "tests/task.json"
    for script, want in (("exact I.", "0"), ("admit.", "0"),
                         (None, "0"), ("Qed. Axiom x : False.", "0")):
        proof = tmp_path / "proof.v"
        proof.unlink(missing_ok=True)
        if script is not None:
            proof.write_text(script)
        grade_coq.main(["check_proof.py", str(spec), str(proof)])
        assert (tmp_path / "coq/reward.txt").read_text().strip() == want, script
    solve = (exported["coq"][1] / "solution/solve.sh").read_text()
    proof.write_text(solve.split("<<'SAO_GYM_PROOF'\n", 1)[1].rsplit("SAO_GYM_PROOF", 1)[0])
    grade_coq.main(["check_proof.py", str(spec), str(proof)])
    assert (tmp_path / "coq/reward.txt").read_text().strip() == "1"
    assert json.loads((tmp_path / "coq/verdict.json").read_text())["status"] == "proved"


# ----- harbor's own model and linter -------------------------------------------------------
HARBOR_SCRIPT = """
import json, sys, warnings
from harbor.models.task.task import Task
out = []
for d in sys.argv[1:]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t = Task(d)
    c = t.config
    out.append({"name": t.name, "schema": c.schema_version,
                "mode": c.verifier.environment_mode.value,
                "artifacts": [str(a) for a in c.artifacts], "verifier_s": c.verifier.timeout_sec,
                "agent_s": c.agent.timeout_sec, "workdir": c.environment.workdir,
                "memory_mb": c.environment.memory_mb, "instruction": t.instruction,
                "solve": t.paths.discovered_solve_path is not None,
                "warnings": [str(w.message) for w in caught]})
print(json.dumps(out))
"""


@pytest.mark.slow
def test_exported_tasks_load_with_harbors_model_and_lint_clean(harbor_python, exported):
    dirs = [str(d) for d in exported["code"] + exported["coq"]]
    run = subprocess.run([str(harbor_python), "-c", HARBOR_SCRIPT, *dirs], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    loaded = json.loads(run.stdout)
    assert [t["name"] for t in loaded] == [f"sao-gym/{Path(d).name}" for d in dirs]
    for t, d in zip(loaded, dirs, strict=True):
        assert (t["schema"], t["mode"], t["artifacts"], t["workdir"]) == (
            "1.4", "separate", ["/app"], "/app"), t
        assert t["solve"] and t["warnings"] == [] and t["memory_mb"] == 2048
        assert t["instruction"] == (Path(d) / "instruction.md").read_text()
    assert {t["agent_s"] for t in loaded} == {1800.0, 900.0}
    lint = subprocess.run([str(harbor_python.parent / "harbor"), "lint", "--json", *dirs],
                          capture_output=True, text=True, timeout=300)
    assert (lint.returncode, json.loads(lint.stdout or "null")) == (0, []), (
        lint.stdout[-3000:] + lint.stderr[-2000:])
