"""benchmarks/learning_study.py: its table, steps-to-threshold and resume rules (no training)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import import_benchmark


@pytest.fixture(scope="module")
def study():
    return import_benchmark("learning_study")


def _fake_run(run: Path, successes: list[float], start: float, final: float) -> None:
    run.mkdir(parents=True)
    with (run / "metrics.jsonl").open("w") as f:
        for step, s in enumerate(successes, 1):
            f.write(json.dumps({"step": step, "rollout/success_rate": s,
                                "time/elapsed_s": 60.0 * step}) + "\n")
    (run / "eval_before.json").write_text(json.dumps({"success_rate": start}))
    (run / "eval_after.json").write_text(json.dumps({"success_rate": final}))


def test_steps_to_threshold_reads_a_trailing_mean(study):
    # 0, 1, 1, ...: the mean of the last 5 is 0.8 at step 5, 1 from step 6; a lucky first
    # batch alone (1, then 0s) never counts
    records = [{"step": n, "rollout/success_rate": 0.0 if n == 1 else 1.0} for n in range(1, 20)]
    assert study.steps_to(records, 0.8, window=5) == 5
    assert study.steps_to(records, 0.9, window=5) == 6
    assert study.steps_to(records, 1.01, window=5) is None
    lucky = [{"step": n, "rollout/success_rate": 1.0 if n == 1 else 0.0} for n in range(1, 20)]
    assert study.steps_to(lucky, 0.25, window=5) is None
    assert study.steps_to(records[:3], 0.5, window=5) is None  # shorter than the window


def test_report_tables_mean_and_spread_over_seeds(study, tmp_path):
    name = "SAO"
    for seed, (start, final) in enumerate([(0.1, 0.5), (0.2, 0.7)]):
        _fake_run(tmp_path / "runs" / study.slug(name) / f"seed{seed}", [0.0] + [1.0] * 24,
                  start, final)
    summary = study.row_summary(tmp_path, name, [0, 1, 2], threshold=0.5)
    assert summary["seeds_done"] == 2 and summary["final"] == [0.5, 0.7]
    # the trailing mean of 20 steps is 19/20 at step 20
    assert summary["steps_to_threshold"] == [20, 20] and summary["wall_min"] == [25.0, 25.0]
    text = study.table([summary], 0.5, "25 steps")
    row = text.splitlines()[-1]
    # mean +- sample sd: start 0.15 +- 0.071, final 0.6 +- 0.141, gain 0.45 +- 0.071
    assert row == ("| SAO | 2 | 0.150 ± 0.071 | 0.600 ± 0.141 | 0.450 ± 0.071 | +0.000, +0.000 "
                   "| 20, 20 | 25.0 |")
    other = study.row_summary(tmp_path, name, [1], threshold=0.5)
    other["row"], other["final"] = "other", [0.65]
    assert "| -0.050 |" in study.table([summary, other], 0.5, "25 steps").splitlines()[-1]


def test_finished_runs_are_kept_and_the_recipe_is_pinned(study, tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(study, "sao_gym", lambda args, logfile: calls.append(args))
    done = tmp_path / "runs" / study.slug("SAO") / "seed0"
    _fake_run(done, [0.5], 0.1, 0.2)
    (tmp_path / "logs").mkdir()
    assert study.train(tmp_path, tmp_path / "warm", "SAO", [], 0, 10) == done
    assert calls == []  # finished: not run again
    partial = tmp_path / "runs" / study.slug("SAO") / "seed1" / "checkpoints" / "step_0000005"
    partial.mkdir(parents=True)
    study.train(tmp_path, tmp_path / "warm", "SAO", [], 1, 10)
    assert calls == [["train", "--resume", str(partial.parents[1])]]
    (tmp_path / "study.yaml").write_text("algorithm: grpo\n")
    with pytest.raises(SystemExit, match="differs from this script's STUDY"):
        study.main(["--out", str(tmp_path), "--report"])


def test_wall_time_sums_the_segments_of_a_resumed_run(study, tmp_path):
    # 3 steps (180 s), killed; resumed from step 2, whose clock starts again: 2 more
    # steps of 50 s each. The loop ran 180 + 100 s, not the last segment's 100.
    run = tmp_path / "runs" / "sao" / "seed0"
    _fake_run(run, [0.0, 0.5, 1.0], start=0.0, final=1.0)
    with (run / "metrics.jsonl").open("a") as f:
        for step, t in ((3, 50.0), (4, 100.0)):
            f.write(json.dumps({"step": step, "rollout/success_rate": 1.0,
                                "time/elapsed_s": t}) + "\n")
    summary = study.row_summary(tmp_path, "SAO", [0], 0.5)
    assert summary["wall_min"] == [pytest.approx(280.0 / 60)]
