"""benchmarks/horizon_study.py and vs_trl_heldout.py: archive, resume, clock (no training)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tests.helpers import import_benchmark


@pytest.fixture(scope="module")
def study():
    return import_benchmark("horizon_study")


def _finished_run(run: Path, rows: list[dict]) -> None:
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "config.yaml").write_text("seed: 3\n")
    (run / "eval_before.json").write_text(json.dumps({"success_rate": 0.1}))
    (run / "eval_after.json").write_text(json.dumps({"success_rate": 0.6}))
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "big.bin").write_bytes(b"\0" * 1000)


def test_archive_keeps_small_files_and_restores_them(study, tmp_path):
    out, archive = tmp_path / "out", tmp_path / "archive"
    rows = [{"step": n, "time/elapsed_s": 2.0 * n} for n in range(1, 4)]
    run = out / "long" / "runs" / "sao" / "seed3"
    _finished_run(run, rows)
    study.keep(run, archive / "long" / "runs" / "sao" / "seed3")
    kept = archive / "long" / "runs" / "sao" / "seed3"
    assert sorted(p.name for p in kept.iterdir()) == [
        "config.yaml", "eval_after.json", "eval_before.json", "metrics.jsonl.gz"]
    first = (kept / "metrics.jsonl.gz").read_bytes()
    study.keep(run, kept)
    assert (kept / "metrics.jsonl.gz").read_bytes() == first  # no timestamp: no churn in git
    assert gzip.decompress(first) == (run / "metrics.jsonl").read_bytes()

    fresh = tmp_path / "fresh"
    partial = fresh / "long" / "runs" / "sao" / "seed3"
    partial.mkdir(parents=True)
    (partial / "metrics.jsonl").write_text("{}\n")  # an unfinished run is replaced
    assert study.restore(archive, fresh) == 1
    assert (partial / "metrics.jsonl").read_text() == (run / "metrics.jsonl").read_text()
    assert json.loads((partial / "eval_after.json").read_text())["success_rate"] == 0.6
    assert study.restore(archive, fresh) == 0  # finished runs are left alone


def test_a_finished_run_needs_no_warm_start(study, tmp_path, monkeypatch):
    out = tmp_path / "out"
    run = out / "short" / "runs" / "running-mean-baseline-dis" / "seed1"
    _finished_run(run, [{"step": 1, "time/elapsed_s": 1.0}])

    def no(*args, **kwargs):
        raise AssertionError("a finished run must not start anything")

    monkeypatch.setattr(study.ls, "warm_start", no)
    monkeypatch.setattr(study.ls, "train", no)
    archive = tmp_path / "archive"
    assert study.run_row(out, "short", "running-mean baseline (DIS)", 1, 200, archive) == run
    assert (archive / "short" / "runs" / "running-mean-baseline-dis" / "seed1"
            / "eval_after.json").exists()


def _warm_start(warm: Path) -> None:
    (warm / "model" / "warm_start").mkdir(parents=True)
    (warm / "model" / "warm_start" / "config.json").write_text("{}")
    (warm / "model" / "warm_start" / "model.safetensors").write_bytes(b"w" * 100)
    (warm / "model" / "base").mkdir()
    (warm / "model" / "base" / "model.safetensors").write_bytes(b"b" * 100)
    (warm / "config.yaml").write_text("seed: 1\n")
    (warm / "eval_before.json").write_text(json.dumps({"success_rate": 0.4}))


def test_a_warm_start_is_archived_until_its_rows_finish(study, tmp_path):
    out, archive = tmp_path / "out", tmp_path / "archive"
    warm = out / "long" / "warm" / "seed1"
    _warm_start(warm)
    study.keep_warm(warm, archive / "long" / "warm" / "seed1")
    kept = archive / "long" / "warm" / "seed1"
    assert (kept / "model" / "warm_start" / "model.safetensors").read_bytes() == b"w" * 100
    assert not (kept / "model" / "base").exists()  # the rows start from warm_start only
    assert not list(archive.glob("**/*.tmp"))

    fresh = tmp_path / "fresh"
    study.restore(archive, fresh)
    back = fresh / "long" / "warm" / "seed1"
    assert json.loads((back / "eval_before.json").read_text())["success_rate"] == 0.4
    assert (back / "model" / "warm_start" / "config.json").exists()

    names = list(study.rows_at("long"))
    for name in names[:-1]:
        _finished_run(archive / "long" / "runs" / study.ls.slug(name) / "seed1", [{"step": 1}])
    study.drop_warm(archive, "long", [1])
    assert kept.exists()  # one row of it is still to run
    _finished_run(archive / "long" / "runs" / study.ls.slug(names[-1]) / "seed1", [{"step": 1}])
    study.drop_warm(archive, "long", [1])
    assert not kept.exists()


def test_jobs_take_the_warm_starts_in_turn(study):
    rows = ["SAO", "GRPO+DIS (G=8)", "SAO, bootstrap truncated"]
    jobs = study.job_order(["short", "long"], [1, 2], rows)
    # every run once; the long-only row only at the long horizon
    assert sorted(jobs) == sorted(
        [(h, n, s) for h in ("short", "long") for s in (1, 2) for n in rows[:2]]
        + [("long", rows[2], 1), ("long", rows[2], 2)])
    # the first jobs each need a different warm start, so a pool of 2 makes two at once
    assert len({(h, s) for h, _, s in jobs[:4]}) == 4
    assert study.job_order(["long"], [0], ["SAO"]) == [("long", "SAO", 0)]


def test_no_worker_waits_while_a_run_it_could_start_is_left(study):
    import threading

    rm = "running-mean baseline (DIS)"
    jobs = study.Jobs([("short", "SAO", 1), ("long", "SAO", 2), ("short", rm, 1),
                       ("long", rm, 2), ("short", "GRPO+DIS (G=8)", 1)],
                      ready={("short", 1)})
    assert jobs.take() == ("short", "SAO", 1)  # its warm start is there
    assert jobs.take() == ("long", "SAO", 2)  # this worker makes long seed 2's
    assert jobs.making == {("long", 2)}
    assert jobs.take() == ("short", rm, 1)
    # the next in order waits on the warm start being made: the one after it goes first
    assert jobs.take() == ("short", "GRPO+DIS (G=8)", 1)
    got = []
    waiter = threading.Thread(target=lambda: got.append(jobs.take()))
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive() and got == []  # only a run of the warm start being made is left
    jobs.warm_ready("long", 2)
    waiter.join(5)
    assert got == [("long", rm, 2)] and jobs.take() is None


def test_trl_wall_clock_sums_resumed_segments(tmp_path):
    bench = import_benchmark("vs_trl_heldout")
    run = tmp_path / "run"
    run.mkdir()
    # 3 steps to 30 s, then a resume whose clock restarts: 2 more steps to 25 s
    times = [10.0, 20.0, 30.0, 12.0, 25.0]
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({"step": i + 1, "time/elapsed_s": t}) + "\n" for i, t in enumerate(times)))
    assert bench.sao_wall_s(run) == pytest.approx(55.0)


def test_trl_turn_budget_is_the_envs_own(tmp_path):
    bench = import_benchmark("vs_trl_heldout")
    # KeyChain: hops + 1 turns and a slack of max(2, hops // 4)
    assert bench.episode_turns("sao_gym/KeyChain-v0", {"hops": 8}) == 11
    assert bench.episode_turns("sao_gym/KeyChain-v0", {"hops": 32}) == 41
    # Arithmetic: its registered turn limit
    assert bench.episode_turns("sao_gym/Arithmetic-v0", {}) == 8


def test_trl_archive_keeps_a_finished_seed_and_reuses_it(tmp_path, monkeypatch):
    bench = import_benchmark("vs_trl_heldout")
    out, archive = tmp_path / "out", tmp_path / "archive"
    played = []

    def run_seed(args, seed):
        played.append(seed)
        sao = out / "runs" / "sao" / f"seed{seed}"
        sao.mkdir(parents=True)
        (sao / "metrics.jsonl").write_text('{"step": 1, "rollout/success_rate": 0.25}\n')
        return {"seed": seed, "sao": {"success_rate": 0.5 + seed / 10}}

    monkeypatch.setattr(bench, "run_seed", run_seed)
    args = bench.argparse.Namespace(archive=archive, out=out)
    archive.mkdir()
    first = bench.archived_seed(args, 1)
    assert played == [1] and first["sao"]["success_rate"] == 0.6
    with gzip.open(archive / "sao-seed1-metrics.jsonl.gz", "rt") as f:
        assert json.loads(f.read())["rollout/success_rate"] == 0.25
    # the next invocation (a new session: nothing under --out) reads the archive
    monkeypatch.setattr(bench, "run_seed", lambda *a: pytest.fail("seed 1 ran again"))
    assert bench.archived_seed(args, 1) == first


def test_the_archive_is_not_git_ignored():
    """The archive lives under docs/data to be committed: no ignore rule (such
    as one for run directories) may swallow its ``runs/`` folders."""
    import shutil
    import subprocess

    root = Path(__file__).resolve().parents[2]
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("not a git checkout")
    paths = [f"docs/data/{d}/long/runs/sao/seed0/config.yaml"
             for d in ("horizon_study", "vs_trl_heldout")]
    done = subprocess.run(["git", "check-ignore", "--no-index", *paths], cwd=root,
                          capture_output=True, text=True)
    assert done.returncode == 1, f"ignored: {done.stdout}"
    # and a training run's own output directory still is
    assert subprocess.run(["git", "check-ignore", "--no-index", "runs/x/metrics.jsonl"],
                          cwd=root, capture_output=True).returncode == 0


def test_an_interrupted_warm_start_is_resumed_and_a_bare_one_made_anew(study, tmp_path,
                                                                       monkeypatch):
    from sao_gym.runtime.prepare.start import DEMONSTRATIONS, WARM_STATE

    calls: list[list[str]] = []
    monkeypatch.setattr(study.ls, "sao_gym", lambda args, logfile: calls.append(args))
    out = tmp_path / "short"
    (out / "logs").mkdir(parents=True)
    warm = out / "warm" / "seed4"
    (warm / "model" / WARM_STATE).mkdir(parents=True)
    (warm / "config.yaml").write_text("seed: 4\n")
    (warm / "model" / WARM_STATE / DEMONSTRATIONS).write_bytes(b"kept")
    assert study.ls.warm_start(out, 4) == warm
    assert calls == [["train", "--resume", str(warm)]]
    assert (warm / "model" / WARM_STATE / DEMONSTRATIONS).exists()  # nothing deleted

    calls.clear()  # the warm start made, its evaluation missing: resumed too
    (warm / "model" / WARM_STATE / DEMONSTRATIONS).unlink()
    (warm / "model" / "warm_start").mkdir()
    (warm / "model" / "warm_start" / "config.json").write_text("{}")
    study.ls.warm_start(out, 4)
    assert calls == [["train", "--resume", str(warm)]]

    calls.clear()  # killed before the demonstrations were kept: made anew
    bare = out / "warm" / "seed5"
    bare.mkdir(parents=True)
    (bare / "config.yaml").write_text("seed: 5\n")
    study.ls.warm_start(out, 5)
    assert len(calls) == 1 and calls[0][:2] == ["train", str(out / "study.yaml")]
    assert not bare.exists()  # the half-made run dir was cleared first


def test_a_run_stopped_before_its_end_is_not_archived(study, tmp_path, monkeypatch):
    out, archive = tmp_path / "out", tmp_path / "archive"
    warm = out / "long" / "warm" / "seed2"
    _warm_start(warm)
    (warm / "config.yaml").write_text("rollout: {max_new_tokens: 24}\n")
    run = out / "long" / "runs" / "sao" / "seed2"

    def stopped(out_h, warm_dir, name, sets, seed, steps):  # SIGTERM: checkpoint, exit 0
        run.mkdir(parents=True)
        (run / "metrics.jsonl").write_text('{"step": 1}\n')
        (run / "eval_before.json").write_text("{}")
        return run

    monkeypatch.setattr(study.ls, "train", stopped)
    monkeypatch.setattr(study, "values_file", lambda *a: pytest.fail("no critic values yet"))
    assert study.run_row(tmp_path / "out", "long", "SAO", 2, 100, archive) == run
    assert not (archive / "long" / "runs").exists()
    assert (archive / "long" / "warm" / "seed2" / "model" / "warm_start").exists()  # kept


def test_trl_report_cells_and_gains(tmp_path):
    bench = import_benchmark("vs_trl_heldout")

    def summary(successes, episodes=100):
        return {"success_rate": successes / episodes, "episodes": episodes,
                "successes": successes}

    train = {"trajectories": 480, "wall_s": 600.4, "reward_first5": 0.25,
             "reward_last5": 0.5, "tool_calls_per_episode": 9.125}
    results = [{"seed": s, "before": summary(50), "sao": summary(50 + 10 * (s + 1)),
                "trl": summary(50 - 10 * s), "sao_wall_s": 600.0, "sao_trajectories": 3200,
                "trl_train": train} for s in (0, 1)]
    results[1]["kinds"] = {side: {"solved": n, "toolless_turn": 2, "out_of_turns": 1,
                                  "wrong_answer": 97 - n} for side, n in (("sao", 70), ("trl", 40))}
    text = bench.report(tmp_path, results)
    assert "| 1 | SAO | 70 | 2 | 1 | 27 |" in text and "| 1 | TRL | 40 | 2 | 1 | 57 |" in text
    assert "| 0 | SAO |" not in text  # a seed kept from before the breakdown has none
    rows = [line for line in text.splitlines() if line.startswith("| 0 |")]
    assert len(rows) == 1
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    # before / SAO / TRL with their Wilson intervals: 60 of 100 -> [0.502, 0.691]
    assert cells[2] == "0.600 [0.502, 0.691]" and cells[3].startswith("0.500 [")
    assert cells[4] == "3200 / 600" and cells[5] == "480 / 600"
    assert cells[6] == "0.250 -> 0.500" and cells[7] == "9.12"
    # mean gains: SAO (+0.1, +0.2) -> +0.150, TRL (0, -0.1) -> -0.050
    assert "SAO +0.150, TRL -0.050" in text
    assert bench.read_json(tmp_path / "results.json") == results


def test_trl_episode_kinds_from_atif_files(tmp_path):
    bench = import_benchmark("vs_trl_heldout")

    def write(i, reward, truncated, calls_per_turn):
        steps = [{"source": "system", "message": "s"}, {"source": "user", "message": "u"}]
        for n in calls_per_turn:
            steps.append({"source": "agent", "message": "x",
                          "tool_calls": [{"function_name": "lookup"}] * n or None})
        (tmp_path / f"eval-{i}.json").write_text(json.dumps(
            {"steps": steps, "extra": {"reward": reward, "truncated": truncated}}))

    write(0, 1.0, False, [1, 1, 0])       # solved, even with a tool-less turn
    write(1, 0.0, False, [1, 0, 1])       # a turn without a call
    write(2, 0.0, True, [1, 1, 1])        # ran out of turns
    write(3, 0.0, False, [1, 1])          # the env ended it unrewarded
    write(4, 0.0, False, [1, 2])
    assert bench.episode_kinds(tmp_path) == {"solved": 1, "toolless_turn": 1,
                                             "out_of_turns": 1, "wrong_answer": 2}


def test_policy_episode_kinds_reuses_a_complete_evaluation(tmp_path, monkeypatch):
    """The trajectories the run's own evaluation wrote are read, not evaluated again;
    an incomplete set is evaluated anew."""
    bench = import_benchmark("vs_trl_heldout")
    out = tmp_path / "heldout_trajectories"
    out.mkdir()
    for i, reward in enumerate([1.0, 0.0, 1.0]):
        steps = [{"source": "agent", "message": "x", "tool_calls": [{"function_name": "f"}]}]
        (out / f"eval-{i}.json").write_text(json.dumps(
            {"steps": steps, "extra": {"reward": reward, "truncated": reward == 0}}))
    calls = []
    monkeypatch.setattr(bench.subprocess, "run", lambda *a, **k: calls.append(a))
    monkeypatch.setattr(bench, "eval_command", lambda *a: ["sao-gym", "eval"])
    config = {"eval": {"episodes": 3}}
    kinds = bench.policy_episode_kinds(tmp_path / "policy", config, tmp_path)
    assert kinds == {"solved": 2, "toolless_turn": 0, "out_of_turns": 1, "wrong_answer": 0}
    assert calls == [] and bench.read_json(tmp_path / "heldout_kinds.json") == kinds

    (tmp_path / "heldout_kinds.json").unlink()
    with pytest.raises(RuntimeError, match="holds 0 episodes, not the 4"):  # evaluated anew
        bench.policy_episode_kinds(tmp_path / "policy", {"eval": {"episodes": 4}}, tmp_path)
    assert len(calls) == 1 and calls[0][0][-2:] == ["--trajectories", str(out)]


def test_sao_side_kinds_come_from_the_runs_own_kept_evaluation(tmp_path, monkeypatch):
    """kept_eval_trajectories writes the run's eval_after rollouts as ATIF where
    policy_episode_kinds reads them: no evaluation is run again."""
    from sao_gym.rollout_store import RolloutWriter, rollout_record
    from sao_gym.types import Rollout, StopReason

    bench = import_benchmark("vs_trl_heldout")

    def rollout(reward, truncated, calls):
        messages = [{"role": "user", "content": "start at 1"}]
        for n in calls:
            messages.append({"role": "assistant", "content": None if n else "no call",
                             "tool_calls": [{"id": f"c{k}", "type": "function", "function": {
                                 "name": "lookup", "arguments": '{"key": "1"}'}}
                                 for k in range(n)] or None})
        return Rollout(token_ids=[1, 2, 3], loss_mask=[0, 1, 1], rollout_logprobs=[0, -1, -1],
                       policy_versions=[-1, 0, 0], reward=reward, terminated=not truncated,
                       truncated=truncated, stop_reason=StopReason.TRUNCATED if truncated
                       else StopReason.TERMINATED, infra_failure=False, messages=messages,
                       env_id="e/E-v0", task_id="t", seed=1, metrics={})

    with RolloutWriter(tmp_path, "eval_after") as w:
        for r in (rollout(1.0, False, [1, 1]), rollout(0.0, True, [1, 1, 1]),
                  rollout(0.0, False, [1, 0]), rollout(0.0, False, [1])):
            w.write(rollout_record(r, split="eval_after", step=9))
    bench.kept_eval_trajectories(tmp_path)
    monkeypatch.setattr(bench.subprocess, "run", lambda *a, **k: pytest.fail("evaluated again"))
    kinds = bench.policy_episode_kinds(tmp_path / "policy", {"eval": {"episodes": 4}}, tmp_path)
    assert kinds == {"solved": 1, "toolless_turn": 1, "out_of_turns": 1, "wrong_answer": 1}

    bench.kept_eval_trajectories(tmp_path / "none")  # a run that kept no rollouts: nothing
    assert not (tmp_path / "none" / "heldout_trajectories").exists()


def test_an_archive_holds_the_runs_of_one_recipe(study, tmp_path):
    out, archive = tmp_path / "out", tmp_path / "archive"
    study.horizon_dir(out, "short")
    study.check_archive(archive, out, "short")  # a new archive is marked with the recipe
    assert (archive / "short" / "study.yaml").read_text() == (
        out / "short" / "study.yaml").read_text()
    _finished_run(archive / "short" / "runs" / "sao" / "seed0", [{"step": 1}])
    study.check_archive(archive, out, "short")  # the same recipe: fine
    other = tmp_path / "other"
    (other / "short").mkdir(parents=True)
    (other / "short" / "study.yaml").write_text("total_steps: 7\n")
    with pytest.raises(SystemExit, match="another recipe"):
        study.check_archive(archive, other, "short")
    # runs kept before archives were marked are of an unknown recipe: refused too
    (archive / "short" / "study.yaml").unlink()
    with pytest.raises(SystemExit, match="unrecorded recipe"):
        study.check_archive(archive, out, "short")


def test_the_published_archive_is_not_restored_into_a_study_of_todays_recipe(study, tmp_path):
    from tests.helpers import BENCHMARKS

    study.horizon_dir(tmp_path, "long")
    with pytest.raises(SystemExit):  # its runs were made before the curriculum
        study.check_archive(BENCHMARKS.parent / "docs" / "data" / "horizon_study", tmp_path,
                            "long")
