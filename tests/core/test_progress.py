"""ProgressDisplay: plain lines off a terminal (rate limited), a Rich panel on one."""

import math
import re
from io import StringIO

import pytest
from rich.console import Console

from sao_gym.progress import ProgressDisplay, format_duration, format_value

METRICS = {
    "rollout/return_mean": 0.5, "rollout/success_rate": 0.25, "perf/trajectories_per_s": 3.5,
    "perf/tokens_per_s": 12345.6, "async/staleness_mean": 0.75, "async/staleness_max": 3,
    "async/queue_depth": 4, "async/in_flight": 16, "loss/policy": -0.0123,
    "sao/clip_ratio": 0.0012, "critic/explained_variance": 0.42,
}


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def plain(total=100, interval=10.0, **kwargs):
    clock = FakeClock()
    console = Console(file=StringIO(), width=80)  # not a terminal
    display = ProgressDisplay(total, console=console, plain_interval_s=interval, clock=clock,
                              **kwargs)
    return display, clock, console.file


def test_plain_line_format():
    display, clock, out = plain()
    clock.now += 60.0
    display.update(12, METRICS)
    assert not display.live
    assert out.getvalue() == (
        "step 12/100 | return 0.500 | success 25.0% | traj/s 3.50 | tok/s 12,346 | "
        "stale mean 0.75 | stale max 3 | queue 4 | in flight 16 | policy loss -0.0123 | "
        "clip ratio 1.20e-03 | expl. var 0.420 | elapsed 1m00s | ETA 7m20s\n")


def test_plain_lines_are_rate_limited_and_the_last_step_always_shows():
    display, clock, out = plain(total=30, interval=10.0)
    with display:
        for step in range(1, 31):
            clock.now += 1.0
            display.update(step, METRICS)
    steps = [line.split(" | ")[0] for line in out.getvalue().splitlines()]
    assert steps == ["step 1/30", "step 11/30", "step 21/30", "step 30/30"]
    assert out.getvalue().splitlines()[-1].endswith("ETA 0s")


def test_close_prints_the_held_back_line():
    display, clock, out = plain(total=100, interval=10.0)
    display.update(1, METRICS)
    clock.now += 2.0
    display.update(2, METRICS)
    assert len(out.getvalue().splitlines()) == 1
    display.close()
    display.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and lines[-1].startswith("step 2/100")
    display.update(3, METRICS)  # after close: ignored
    assert len(out.getvalue().splitlines()) == 2


def test_missing_and_odd_values_never_crash():
    display, clock, out = plain()
    display.update(1, {"rollout/return_mean": math.nan, "rollout/success_rate": None,
                       "perf/tokens_per_s": "n/a", "async/queue_depth": object(),
                       "loss/policy": math.inf, "sao/clip_ratio": [1, 2]})
    display.update("oops", {"loss/policy": -math.inf})
    display.close()
    first = out.getvalue().splitlines()[0]
    assert "return nan" in first and "success -" in first and "tok/s n/a" in first
    assert "queue -" in first and "policy loss inf" in first and "clip ratio -" in first
    assert "expl. var -" in first and "ETA -" in first
    assert out.getvalue().splitlines()[-1].startswith("step -/100")


def test_eta_counts_only_this_sessions_steps():
    display, clock, out = plain(total=200, initial_step=100)
    clock.now += 50.0
    display.update(110, {})
    assert out.getvalue().rstrip().endswith("elapsed 50s | ETA 7m30s")


def test_eta_counts_training_time_only_from_begin():
    # set-up (a warm start, evaluation) takes 6 minutes before training begins
    display, clock, out = plain(total=100)
    clock.now += 360.0
    display.begin(0)
    clock.now += 10.0
    display.log(1, {})  # the trainer's sinks call log()
    assert out.getvalue().rstrip().endswith("elapsed 10s | ETA 16m30s")  # 99 steps x 10 s


def test_default_console_writes_plain_lines_to_stderr(capsys):
    with ProgressDisplay(2, clock=FakeClock()) as display:
        display.update(2, METRICS)
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("step 2/2 | return 0.500")


def test_terminal_mode_renders_a_live_panel():
    clock = FakeClock()
    console = Console(file=StringIO(), force_terminal=True, width=120)
    with ProgressDisplay(100, console=console, clock=clock, refresh_per_second=50) as display:
        assert display.live
        clock.now += 60.0
        display.update(12, METRICS)
        display.update(13, {**METRICS, "rollout/return_mean": math.nan, "loss/policy": "x"})
    text = console.file.getvalue()
    assert "12/100" in text and "ETA 7m20s" in text and "12,346" in text
    assert "13/100" in text and "sao-gym train" in text


def test_terminal_mode_without_updates():
    console = Console(file=StringIO(), force_terminal=True, width=120)
    with ProgressDisplay(5, console=console):
        pass
    assert "-/5" in console.file.getvalue()


@pytest.mark.parametrize(("value", "spec", "text"), [
    (None, ".2f", "-"), ("", ".2f", "-"), ("abc", ".2f", "abc"), (math.nan, ".2f", "nan"),
    (-math.inf, ".2f", "-inf"), (True, ".0f", "1"), (0.123456, ".3f", "0.123"),
    (2, "bogus", "2"), (object(), ".2f", "-"),
])
def test_format_value(value, spec, text):
    assert format_value(value, spec) == text


def test_format_duration():
    assert [format_duration(s) for s in (None, math.nan, -1, 0, 45.4, 125, 3723)] == [
        "-", "-", "-", "0s", "45s", "2m05s", "1h02m03s"]


def _eta_seconds(line):
    """The ETA of a plain line in seconds (``1h02m03s``, ``2m05s``, ``45s``)."""
    parts = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(\d+)s", line.rstrip().rsplit("ETA ", 1)[1])
    hours, minutes, seconds = (int(p or 0) for p in parts.groups())
    return 3600 * hours + 60 * minutes + seconds


@pytest.mark.parametrize("total", [20, 100, 400])
def test_eta_is_right_within_2x_after_a_tenth_of_a_slow_starting_run(total):
    # the first step carries the start-up (first episodes, compilation): 30 s; then
    # steady steps of 0.5-1.5 s. A run of 20 steps once showed 5m38s for 39 s.
    display, clock, out = plain(total=total, interval=0.0)
    display.begin(0)
    durations = [30.0] + [(0.5, 1.0, 1.5)[i % 3] for i in range(total - 1)]
    for step, seconds in enumerate(durations, start=1):
        clock.now += seconds
        display.update(step, {})
        if step >= total / 10 and step < total:
            eta = _eta_seconds(out.getvalue().splitlines()[-1])
            left = sum(durations[step:])
            assert left / 2 <= eta <= 2 * left, (step, eta, left)
