"""plot_runs and `sao-gym plot`: PNG curves from metrics.jsonl."""

import math

import pytest

from sao_gym.cli import main
from sao_gym.logging import JsonlLogger
from sao_gym.plotting import FIGURES, plot_runs, smooth_ema

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
ALL = [spec.filename for spec in FIGURES]


def write_run(run_dir, steps=8, keys=None, seed=0.0):
    """A run dir whose metrics.jsonl holds every plotted metric (or only ``keys``)."""
    with JsonlLogger(run_dir) as logger:
        for step in range(1, steps + 1):
            metrics = {
                "rollout/success_rate": min(1.0, step / steps + seed),
                "rollout/return_mean": step / steps + seed,
                "sao/clip_ratio": 1e-3 * (1 + step % 3),
                "critic/explained_variance": math.nan if step == 1 else 1 - 1 / step,
                "async/staleness_mean": 0.5 + seed,
                "async/staleness_max": 2 + step % 2,
                "perf/trajectories_per_s": 3.0 + step,
                "perf/tokens_per_s": 1000.0 * step,
                "loss/policy": 0.1,
            }
            if keys is not None:
                metrics = {k: v for k, v in metrics.items() if k in keys}
            logger.log(step, metrics)
    return run_dir


def assert_pngs(paths, names):
    assert [p.name for p in paths] == names
    for path in paths:
        data = path.read_bytes()
        assert len(data) > 1000 and data.startswith(PNG_SIGNATURE)


def test_plot_one_run_writes_every_figure(tmp_path):
    run = write_run(tmp_path / "run_a")
    paths = plot_runs(run)
    assert ALL == ["success.png", "clip_ratio.png", "explained_variance.png", "staleness.png",
                   "throughput.png"]
    assert_pngs(paths, ALL)
    assert all(p.parent == run / "plots" for p in paths)


def test_compare_two_runs_into_an_out_dir(tmp_path):
    a = write_run(tmp_path / "a" / "run")
    b = write_run(tmp_path / "b" / "run", steps=5, seed=0.1)  # same name: labels widen
    paths = plot_runs(a, [b], tmp_path / "cmp", smooth=0.6)
    assert_pngs(paths, ALL)
    assert all(p.parent == tmp_path / "cmp" for p in paths)
    assert not (a / "plots").exists()


def test_figures_without_data_are_skipped(tmp_path):
    only_success = write_run(tmp_path / "s", keys={"rollout/success_rate"})
    assert_pngs(plot_runs(only_success), ["success.png"])
    # a metric that only one of two runs has still gets its figure
    staleness = write_run(tmp_path / "st", keys={"async/staleness_max"})
    assert_pngs(plot_runs(only_success, [staleness], tmp_path / "out"),
                ["success.png", "staleness.png"])
    # all-null values (non-finite when logged) count as no data
    with JsonlLogger(tmp_path / "nan") as logger:
        logger.log(1, {"sao/clip_ratio": math.nan})
    assert plot_runs(tmp_path / "nan") == []


def test_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no metrics.jsonl"):
        plot_runs(tmp_path)
    run = write_run(tmp_path / "run")
    with pytest.raises(FileNotFoundError, match="missing"):
        plot_runs(run, [tmp_path / "missing"])
    with pytest.raises(ValueError, match="smooth"):
        plot_runs(run, smooth=1.0)


def test_smooth_ema_is_bias_corrected():
    # by hand: m_t = w m_(t-1) + (1 - w) x_t from m_0 = 0, drawn as m_t / (1 - w^t);
    # nan stays nan and does not count as a step
    out = smooth_ema([1.0, 3.0, math.nan, 5.0], 0.5)
    # m = 0.5, 1.75, -, 3.375 over 1 - w^t = 0.5, 0.75, -, 0.875
    assert out[0] == 1.0 and out[1] == pytest.approx(7 / 3) and math.isnan(out[2])
    assert out[3] == pytest.approx(27 / 7)
    assert smooth_ema([1.0, 2.0], 0.0) == [1.0, 2.0]
    # a slow first step does not hold the curve down: throughput 0.2, then 3.2 a step
    # m = 0.02, 0.338, 0.6242 over 0.1, 0.19, 0.271 (initialised at x_1: 0.2, 0.5, 0.77)
    out = smooth_ema([0.2, 3.2, 3.2], 0.9)
    assert out == pytest.approx([0.2, 0.338 / 0.19, 0.6242 / 0.271])
    out = smooth_ema([math.nan, 4.0, 4.0], 0.9)  # a constant stays constant
    assert math.isnan(out[0]) and out[1:] == pytest.approx([4.0, 4.0])


def test_cli_plot_prints_the_paths(tmp_path, capsys):
    a = write_run(tmp_path / "a")
    b = write_run(tmp_path / "b", seed=0.2)
    c = write_run(tmp_path / "c", seed=0.3)
    out_dir = tmp_path / "figs"
    assert main(["plot", str(a), "--compare", str(b), "--compare", str(c),
                 "--out", str(out_dir), "--smooth", "0.5"]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [str(out_dir / name) for name in ALL]
    assert main(["plot", str(a)]) == 0
    assert capsys.readouterr().out.split() == [str(a / "plots" / name) for name in ALL]


def test_cli_plot_failures(tmp_path, capsys):
    assert main(["plot", str(tmp_path / "nowhere")]) == 1
    assert "FAIL: no metrics.jsonl" in capsys.readouterr().err
    write_run(tmp_path / "empty", keys=set())
    assert main(["plot", str(tmp_path / "empty")]) == 1
    assert "nothing to plot" in capsys.readouterr().err


def test_a_panel_repeating_another_is_left_out(tmp_path):
    from sao_gym.logging import read_metrics
    from sao_gym.plotting import figure_panels

    success = next(spec for spec in FIGURES if spec.filename == "success.png")
    binary = tmp_path / "binary"  # 0/1 rewards: the mean return is the success rate
    with JsonlLogger(binary) as logger:
        for step, rate in enumerate([0.25, 0.5, 0.75], 1):
            logger.log(step, {"rollout/success_rate": rate, "rollout/return_mean": rate})
    shaped = write_run(tmp_path / "shaped", steps=4, seed=0.5)  # returns above 1 differ
    assert [y for y, _ in figure_panels(success, [read_metrics(binary)])] == ["success rate"]
    assert [y for y, _ in figure_panels(success, [read_metrics(shaped)])] == [
        "success rate", "mean return"]
    # a panel is kept when any run tells it apart
    assert len(figure_panels(success, [read_metrics(binary), read_metrics(shaped)])) == 2


def test_eval_marks_place_before_and_after_with_intervals(tmp_path):
    import json

    from sao_gym.logging import read_metrics
    from sao_gym.plotting import eval_marks

    run = write_run(tmp_path / "run", steps=6)
    records = read_metrics(run)
    assert eval_marks(run, records) == []
    (run / "eval_before.json").write_text(json.dumps(
        {"success_rate": 0.8, "episodes": 12, "infra_failures": 2}))  # old file: no interval
    (run / "eval_after.json").write_text(json.dumps(
        {"success_rate": 0.5, "episodes": 4, "success_interval": [0.1, 0.9]}))
    (before, after) = eval_marks(run, records)
    assert before[:3] == ("held-out before RL", 1, 0.8)
    assert before[3:] == pytest.approx((0.490, 0.943), abs=1e-3)  # Wilson, 8 of 10
    assert after == ("held-out after RL", 6, 0.5, 0.1, 0.9)
    assert_pngs(plot_runs(run, smooth=0.9), ALL)


def test_an_evaluation_at_full_success_is_marked(tmp_path):
    # as an older run stored it: the upper bound within rounding below the rate of 1.0
    import json

    run = write_run(tmp_path / "run")
    (run / "eval_after.json").write_text(json.dumps(
        {"success_rate": 1.0, "success_interval": [0.9708630432802273, 0.9999999999999999],
         "episodes": 128, "infra_failures": 0}))
    assert_pngs(plot_runs(run), ALL)
