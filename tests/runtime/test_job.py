"""`sao-gym train` / `eval` as a user runs them: kill -9 and resume, SIGTERM, eval."""

import json
import signal
import subprocess
import sys
import time

import pytest

from sao_gym.cli import main
from sao_gym.logging import read_metrics
from sao_gym.rollout_store import RolloutReader
from sao_gym.runtime.config.loader import recipe_path
from sao_gym.runtime.loop.checkpoint import CheckpointManager

SMALL = ["--set", "rollout.concurrency=2", "--set", "rollout.max_new_tokens=8",
         "--set", "rollout.max_episode_steps=2", "--set", "rollout.batch_size=1",
         "--set", "learner.critic_warmup_steps=0", "--set", "rollout.max_context_tokens=1024",
         "--set", "inference.max_batch_size=2", "--set", "warm_start=null",
         "--set", "eval.episodes=0"]


def _train_cmd(*args):
    return [sys.executable, "-m", "sao_gym.cli", "train", *args]


def _wait_for_steps(run, n, proc, timeout=240):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"training exited early: {proc.stderr.read()[-3000:]}")
        rows = read_metrics(run) if (run / "metrics.jsonl").exists() else []
        if len(rows) >= n:
            return rows
        time.sleep(0.2)
    raise AssertionError(f"no {n} steps within {timeout} s")


@pytest.mark.slow
def test_kill_9_then_resume_logs_every_step_once(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.Popen(_train_cmd(*SMALL, "--set", "total_steps=6", "--set",
                                       "checkpoint.every=2", "--out", str(run)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_steps(run, 3, proc)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert CheckpointManager(run).latest() is not None
    done = subprocess.run(_train_cmd("--resume", str(run)), capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert CheckpointManager(run).latest().name == "step_0000006"
    assert not list((run / "checkpoints").glob(".tmp-*"))
    assert "checkpoint: " in done.stdout


@pytest.mark.slow
def test_sigterm_checkpoints_and_exits_cleanly(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.Popen(_train_cmd(*SMALL, "--set", "total_steps=1000", "--set",
                                       "checkpoint.every=0", "--out", str(run)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for_steps(run, 2, proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    rows = read_metrics(run)
    latest = CheckpointManager(run).latest()
    assert latest is not None and int(latest.name.split("_")[1]) == rows[-1]["step"]
    assert [r["step"] for r in rows] == list(range(1, len(rows) + 1))
    # and eval on that run
    assert main(["eval", "--run", str(run), "--episodes", "2", "--max-new-tokens", "8"]) == 0
    result = json.loads((run / "eval.json").read_text())
    assert result["episodes"] == 2 and result["return_mean"] == result["success_rate"]


def test_train_refuses_bad_input(tmp_path, capsys):
    assert main(["train", "--set", "batchsize=2"]) == 2
    assert "valid keys" in capsys.readouterr().err
    assert main(["train", "--set", "batch_size=2"]) == 2
    assert "did you mean 'rollout.batch_size'" in capsys.readouterr().err
    # setup errors: one line, exit 2, before any work (no banner, no traceback)
    demo = str(recipe_path("demo"))  # a config file's env_kwargs belong to its env
    assert main(["train", demo, "--set", "env=sao_gym/MathTIR-v0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--set 'env_kwargs={}' clears them" in err
    # --set env=... picks the generic recipe (no env_kwargs), which warm-starts on the
    # env's oracle: MathTIR's does arithmetic only, not its default tasks
    assert main(["train", "--set", "env=sao_gym/MathTIR-v0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "oracle of sao_gym/MathTIR-v0 cannot play its tasks" in err
    assert "only solves arithmetic tasks" in err
    assert main(["train", "--set", "env=sao_gym/CoqProof-v0",
                 "--set", "warm_start.oracle={slip_rate: 0.1}"]) == 2
    assert "sao_gym/CoqProof-v0 registers no oracle" in capsys.readouterr().err
    assert main(["train", str(tmp_path / "no.yaml")]) == 2
    assert main(["train", "--set", "warm_start.demonstrations=/no/such.jsonl"]) == 2
    assert "warm_start.demonstrations" in capsys.readouterr().err
    assert main(["train", "--set", "env=nope/Nothing-v0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot make env 'nope/Nothing-v0'" in err
    assert main(["train", "--set", "model=/no/such/model"]) == 2
    assert "neither 'tiny'" in capsys.readouterr().err
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    assert main(["train", "--out", str(tmp_path)]) == 2
    assert "--resume" in capsys.readouterr().err
    assert main(["train", "--resume", str(tmp_path / "nope")]) == 2
    assert main(["eval", "--run", str(tmp_path)]) == 2
    assert main(["eval", "--model", str(tmp_path)]) == 2  # --env missing


def test_eval_takes_environment_options(tmp_path, capsys):
    out = tmp_path / "eval.json"
    base = ["eval", "--model", "tiny", "--env", "sao_gym/Arithmetic-v0", "--episodes", "2",
            "--max-new-tokens", "8", "--out", str(out)]
    assert main([*base, "--env-kwargs", '{operators: "+", max_value: 5}']) == 0
    assert json.loads(out.read_text())["env_kwargs"] == {"operators": "+", "max_value": 5}
    assert json.loads(out.read_text())["max_context_tokens"] == 2048
    assert main([*base, "--max-context-tokens", "300"]) == 0
    assert json.loads(out.read_text())["max_context_tokens"] == 300
    capsys.readouterr()
    assert main([*base, "--env-kwargs", "[1, 2]"]) == 2
    assert "YAML mapping" in capsys.readouterr().err
    assert main([*base, "--env-kwargs", "{bogus: 1}"]) == 2  # the env rejects it, clearly
    assert "bogus" in capsys.readouterr().err
    # any other key with --set, applied last
    assert json.loads(out.read_text())["tool_schemas"] == "env"
    assert main([*base, "--set", "rollout.tool_schemas=signature"]) == 0
    assert json.loads(out.read_text())["tool_schemas"] == "signature"
    assert main([*base, "--set", "rollout.tool_schemas=python"]) == 2
    assert "rollout.tool_schemas must be" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("env_id", ["sao_gym/Arithmetic-v0", "sao_gym/MathTIR-v0",
                                    "sao_gym/CoqProof-v0", "sao_gym/CodeRepo-v0"])
def test_eval_runs_the_tiny_model_on_every_environment(env_id, tmp_path, capsys):
    out = tmp_path / "eval.json"
    assert main(["eval", "--model", "tiny", "--env", env_id, "--episodes", "2",
                 "--max-new-tokens", "8", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out) == result
    assert result["env"] == env_id and result["episodes"] == 2
    assert result["infra_failures"] == 0
    # every environment here rewards 0 or 1 by default, so the mean return is the success rate
    assert result["return_mean"] == result["success_rate"] and result["turns_mean"] >= 1


@pytest.mark.slow
def test_the_default_job_warm_starts_evaluates_trains_and_plots(tmp_path, capsys):
    """The `sao-gym train` pipeline of `make demo`, shrunk: every phase leaves its artefact."""
    run = tmp_path / "run"
    # later --set values win over SMALL's
    assert main(["train", *SMALL, "--set", "warm_start.steps=3", "--set", "warm_start.episodes=4",
                 "--set", "rollout.max_new_tokens=16",
                 "--set", "eval.episodes=2", "--set", "total_steps=2", "--out", str(run)]) == 0
    captured = capsys.readouterr()
    assert (run / "model" / "base" / "config.json").is_file()
    assert (run / "model" / "warm_start" / "config.json").is_file()
    before = json.loads((run / "eval_before.json").read_text())
    after = json.loads((run / "eval_after.json").read_text())
    assert before["episodes"] == after["episodes"] == 2
    assert before["model"].endswith("warm_start") and "step_0000002" in after["model"]
    assert [r["step"] for r in read_metrics(run)] == [1, 2]
    # explained variance is not logged (so not drawn) while every return is the same
    plots = {p.name for p in (run / "plots").glob("*.png")}
    assert {"clip_ratio.png", "staleness.png", "success.png", "throughput.png"} <= plots
    assert plots <= {"clip_ratio.png", "explained_variance.png", "staleness.png", "success.png",
                     "throughput.png"}
    assert "warm start step 3/3" in captured.err and str(run / "plots") in captured.out
    # the rollouts kept: each step's (batch of 1) traced by the learner, every evaluation's
    reader = RolloutReader(run)
    assert reader.splits() == ["train", "eval_after", "eval_before"]
    train = reader.episodes("train")
    assert [e["step"] for e in train] == [1, 2] and all(e["traced"] for e in train)
    record = reader.record("train", train[-1]["id"])
    tokens, learner = record["tokens"], record["learner"]
    assert learner["step"] == 2 and set(learner) == {"step", "logprob", "ratio", "dis_mask",
                                                     "advantage", "value", "return"}
    assert all(len(v) == len(tokens["id"]) for v in (*tokens.values(), *(
        v for k, v in learner.items() if k != "step")))
    assert record["messages"][-1]["role"] in ("user", "tool", "assistant")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(run / "model" / "warm_start")
    assert "".join(tokens["text"]) == tok.decode(tokens["id"])  # ASCII task: pieces join
    for split, step in (("eval_before", 0), ("eval_after", 2)):
        kept = reader.episodes(split)
        assert len(kept) == 2 and {e["step"] for e in kept} == {step}
        assert not any(e["traced"] for e in kept)


MY_ENV = '''
import sao_gym
from sao_gym.tools import ToolEnv, ToolResult, tool


class Pick(ToolEnv):
    """Pick the secret digit."""

    async def on_reset(self, options):
        self.task = {"id": "pick", "answer": int(self.np_random.integers(3))}
        return [{"role": "user", "content": "Pick 0, 1 or 2."}], {}

    @tool(description="Pick.", parameters={"type": "object",
          "properties": {"n": {"type": "integer"}}, "required": ["n"]})
    async def pick(self, n: int):
        return ToolResult("ok", terminated=True, reward=float(n == self.task["answer"]))


sao_gym.register("mine/Pick-v0", Pick, max_episode_steps=2)
'''


@pytest.mark.slow
def test_train_and_eval_an_env_from_a_users_module(tmp_path):
    pkg = tmp_path / "src"
    pkg.mkdir()
    (pkg / "my_envs.py").write_text(MY_ENV)
    elsewhere = tmp_path / "work"
    elsewhere.mkdir()
    env = {**__import__("os").environ, "PYTHONPATH": str(pkg)}
    env_id = "my_envs:mine/Pick-v0"
    run = elsewhere / "run"

    def cli(*args, timeout=600):
        return subprocess.run([sys.executable, "-m", "sao_gym.cli", *args], cwd=elsewhere,
                              env=env, capture_output=True, text=True, timeout=timeout)

    check = cli("check", env_id, "--episodes", "2")
    assert check.returncode == 0 and f"PASS: {env_id}" in check.stdout, check.stderr[-2000:]
    train = cli("train", *SMALL, "--set", f"env={env_id}", "--set", "env_kwargs={}",
                "--set", "total_steps=3", "--set", "rollout.batch_size=2", "--out", str(run))
    assert train.returncode == 0, train.stderr[-3000:]
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3]
    assert CheckpointManager(run).latest().name == "step_0000003"
    evaluated = cli("eval", "--run", str(run), "--episodes", "3", "--max-new-tokens", "8")
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    result = json.loads((run / "eval.json").read_text())
    assert result["env"] == env_id and result["episodes"] == 3
    # a module that is not importable is one line and exit code 2
    bad = cli("train", "--set", "env=no_such_module:mine/Pick-v0")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr


SUMMARY = {"success_rate": 0.5, "episodes": 2, "infra_failures": 0}


@pytest.fixture
def fake_job(monkeypatch):
    """The job with a :func:`tests.runtime.fakes.fake_trainer` and a fixed evaluation."""
    from sao_gym.runtime import job

    trainers, evaluated = [], []
    monkeypatch.setattr(job, "place", lambda *a, **k: trainers[-1])
    monkeypatch.setattr(job, "evaluate", lambda *a, **k: evaluated.append(a) or dict(SUMMARY))
    monkeypatch.setattr(job, "_plots", lambda run_dir: [])
    return trainers, evaluated


def test_an_interrupted_run_says_at_which_step_and_claims_no_gain(tmp_path, tiny_model_path,
                                                                  fake_job, capsys):
    import os

    from sao_gym.cli.train import print_result
    from sao_gym.runtime.config.build import train_plan
    from sao_gym.runtime.config.loader import load_config
    from sao_gym.runtime.job import train
    from tests.runtime.fakes import fake_trainer

    trainers, evaluated = fake_job
    trainers.append(fake_trainer(50, stop_at=3,
                                 stop=lambda t: os.kill(os.getpid(), signal.SIGINT)))
    config = load_config(None, ["env=sao_gym/Arithmetic-v0", "warm_start=null",
                                "eval.episodes=2", "total_steps=50", f"model={tiny_model_path}"])
    said = []
    result = train(train_plan(config), tmp_path / "run", say=said.append)
    n = trainers[0].learner.steps_done
    assert result["interrupted"] and result["steps_done"] == n and result["total_steps"] == 50
    assert len(evaluated) == 1 and "eval_after" not in result  # the starting model only
    assert any(f"interrupted at step {n}" in line for line in said), said
    print_result(result)
    out = capsys.readouterr().out
    assert f"interrupted at step {n} of 50" in out and f"--resume {tmp_path / 'run'}" in out
    assert "after RL" not in out and "gain" not in out


def test_resume_says_from_which_step_and_checkpoint(tmp_path, tiny_model_path, fake_job,
                                                    capsys):
    from sao_gym.runtime.config.loader import load_config, save_config
    from tests.runtime.fakes import fake_trainer

    trainers, _ = fake_job
    run = tmp_path / "run"
    checkpoint = run / "checkpoints" / "step_0000004"  # what CheckpointManager finds
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer.json").write_text(json.dumps({"step": 4, "next_seed": 8}))
    save_config(load_config(None, ["env=sao_gym/Arithmetic-v0", "warm_start=null",
                                   "eval.episodes=0", "total_steps=6",
                                   f"model={tiny_model_path}"]), run / "config.yaml")
    trainers.append(fake_trainer(6))
    trainers[0].learner.steps_done = 4
    assert main(["train", "--resume", str(run)]) == 0
    err = capsys.readouterr().err
    assert f"resuming {run} from step 4 (checkpoint {checkpoint})" in err
    assert trainers[0].learner.steps_done == 6


class _Unreachable(__import__("sao_gym").AgentEnv):
    """Every reset fails, as an environment whose backing service is down."""

    async def on_reset(self, options):
        raise ConnectionError("the task service is down")


def test_an_evaluation_where_every_episode_failed_stops_the_job(tmp_path, tiny_model_path):
    """No result is written for it: a success rate of 0 over no episode would be a lie."""
    import sao_gym
    from sao_gym.runtime.config.build import eval_plan, train_plan
    from sao_gym.runtime.config.loader import load_config
    from sao_gym.runtime.job import evaluate, train
    from sao_gym.runtime.loop.source import RolloutsFailing

    sao_gym.register("test/Unreachable-v0", _Unreachable, max_episode_steps=2)
    config = load_config(None, ["env=test/Unreachable-v0", "env_kwargs={}", "warm_start=null",
                                "eval.episodes=3", "total_steps=2", f"model={tiny_model_path}"])
    with pytest.raises(RolloutsFailing, match=r"all 3 episodes failed \(\{'env_error': 3\}\)"):
        evaluate(eval_plan(config), tiny_model_path)
    with pytest.raises(RolloutsFailing, match="all 3 episodes failed"):
        train(train_plan(config), tmp_path / "run", say=lambda text: None)
    assert not (tmp_path / "run" / "eval_before.json").exists()
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_progress_lines_says_how_far_an_evaluation_is_at_each_eighth():
    from types import SimpleNamespace

    from sao_gym.evaluation import progress_lines

    said = []
    on_done = progress_lines(16, said.append)
    for i in range(16):  # solved on even episodes; the 4th is an infra failure
        on_done(SimpleNamespace(reward=float(i % 2 == 0), infra_failure=i == 3))
    assert len(said) == 7  # at 2, 4, ..., 14 of 16: the end is the caller's to say
    assert said[0].startswith("  evaluated 2/16 episodes: success 0.500 (")
    assert said[1].startswith("  evaluated 4/16 episodes: success 0.667, 1 infra failures (")
    assert said[-1].startswith("  evaluated 14/16 episodes: success 0.538, 1 infra failures")


@pytest.mark.parametrize("runtime", ["local", "ray"])
def test_a_dead_rank_rebuilds_the_run_the_same_way_on_either_runtime(tmp_path, tiny_model_path,
                                                                      fake_job, monkeypatch,
                                                                      runtime):
    """RankDied, from a local rank group or Ray actors, goes through one restart path:
    the run is placed again with resume=True, up to plan.restarts times, then it raises."""
    import dataclasses

    from sao_gym.learner.ranks import RankDied, rank_died
    from sao_gym.runtime import job
    from sao_gym.runtime.config.build import train_plan
    from sao_gym.runtime.config.loader import load_config
    from tests.runtime.fakes import fake_trainer

    class Dying:
        learner = type("L", (), {"steps_done": 0})()

        def run(self):
            raise rank_died(1, 4242, "exit code -9", tmp_path / "run")

    config = load_config(None, ["env=sao_gym/Arithmetic-v0", "warm_start=null",
                                f"runtime={runtime}", "eval.episodes=0", "total_steps=2",
                                f"model={tiny_model_path}"])
    plan = dataclasses.replace(train_plan(config), restarts=1)
    placed, queue = [], [Dying(), fake_trainer(2)]
    monkeypatch.setattr(job, "place", lambda *a, **k: placed.append(k["resume"]) or queue.pop(0))
    said = []
    result = job.train(plan, tmp_path / "run", say=said.append)
    assert placed == [False, True] and result["steps_done"] == 2
    assert any("learner rank 1 (pid 4242) died: exit code -9: restarting from the last "
               "checkpoint (0 restart(s) left)" in line for line in said), said
    queue[:], placed[:] = [Dying(), Dying()], []
    with pytest.raises(RankDied, match=r"learner rank 1 \(pid 4242\) died.*--resume"):
        job.train(plan, tmp_path / "run2", say=said.append)
    assert placed == [False, True]  # one restart, then the error
