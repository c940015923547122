"""PNG learning curves of one run or several side by side.

:func:`plot_runs` reads each run's ``metrics.jsonl`` (:func:`sao_gym.logging.read_metrics`)
and writes one figure per concern, with one line per run labelled by the run
dir's name:

==========================  ==================================================
``success.png``             ``rollout/success_rate`` and ``rollout/return_mean``
``clip_ratio.png``          ``sao/clip_ratio``
``explained_variance.png``  ``critic/explained_variance``
``staleness.png``           ``async/staleness_mean`` (solid), ``async/staleness_max`` (dashed)
``throughput.png``          ``perf/trajectories_per_s`` and ``perf/tokens_per_s``
==========================  ==================================================

A panel that no run has data for is left out, and so is a panel whose data
repeats an earlier panel's in every run (mean return *is* the success rate
when rewards are 0/1); a figure left with no panel is not written. With
``smooth`` > 0 each curve is a bias-corrected EMA (:func:`smooth_ema`) over
its faint raw values. Where a run dir holds the job's evaluations
(``eval_before.json``, ``eval_after.json``), the success panel marks them:
held-out success before RL at the first step and after RL at the last, with
95% intervals. Figures are drawn on matplotlib's
Agg canvas (no display, no pyplot state). ``sao-gym plot RUN_DIR [--compare
RUN_DIR2 ...]`` is the CLI.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from sao_gym.logging import read_metrics

__all__ = ["FIGURES", "FigureSpec", "Series", "eval_marks", "figure_panels", "plot_runs",
           "smooth_ema"]

SUCCESS_KEY = "rollout/success_rate"
EVAL_FILES = (("eval_before.json", "before RL"), ("eval_after.json", "after RL"))


@dataclass(frozen=True)
class Series:
    """One metric drawn in a panel."""

    key: str
    """Metric name in ``metrics.jsonl``."""
    label: str
    """Legend suffix when a panel holds several series ('' when it holds one)."""
    linestyle: str = "-"


@dataclass(frozen=True)
class FigureSpec:
    """One PNG: a title and its panels (each a y-label and its series), side by side."""

    filename: str
    title: str
    panels: tuple[tuple[str, tuple[Series, ...]], ...]


FIGURES: tuple[FigureSpec, ...] = (
    FigureSpec("success.png", "Success and return", (
        ("success rate", (Series("rollout/success_rate", ""),)),
        ("mean return", (Series("rollout/return_mean", ""),)),
    )),
    FigureSpec("clip_ratio.png", "DIS clip ratio (share of action tokens masked)", (
        ("clip ratio", (Series("sao/clip_ratio", ""),)),
    )),
    FigureSpec("explained_variance.png", "Critic explained variance", (
        ("explained variance", (Series("critic/explained_variance", ""),)),
    )),
    FigureSpec("staleness.png", "Staleness (learner version - token version)", (
        ("policy versions", (Series("async/staleness_mean", "mean"),
                             Series("async/staleness_max", "max", "--"))),
    )),
    FigureSpec("throughput.png", "Throughput", (
        ("trajectories / s", (Series("perf/trajectories_per_s", ""),)),
        ("tokens / s", (Series("perf/tokens_per_s", ""),)),
    )),
)
"""The figures :func:`plot_runs` writes, in order."""


def _number(value: Any) -> float:
    """A float, nan for null (non-finite when logged) and anything non-numeric."""
    if value is None or isinstance(value, (str, bool)):
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _column(records: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """Steps and values of ``key`` in the records that have it."""
    points = sorted((r["step"], _number(r[key])) for r in records if key in r)
    return [s for s, _ in points], [v for _, v in points]


def smooth_ema(values: Sequence[float], weight: float) -> list[float]:
    """Bias-corrected exponential moving average, ``weight`` on the past (0 = none).

    The average starts at zero and the t-th finite value is shown divided by
    ``1 - weight**t`` (TensorBoard's and Adam's correction): an average
    started at the first value would give that one value the weight
    ``weight**(t-1)``, so a slow first step (start-up) held a short run's
    throughput curve down for tens of steps. nan stays nan and does not
    count as a step.

    >>> [round(v, 4) for v in smooth_ema([1.0, 3.0, float("nan"), 5.0], 0.5)]
    [1.0, 2.3333, nan, 3.8571]
    """
    if not 0.0 <= weight < 1.0:
        raise ValueError(f"smoothing weight must be in [0, 1), got {weight}")
    out, average, t = [], 0.0, 0
    for value in values:
        if not math.isfinite(value):
            out.append(math.nan)
            continue
        t += 1
        average = weight * average + (1.0 - weight) * value
        out.append(average / (1.0 - weight ** t))
    return out


def _labels(run_dirs: Sequence[Path]) -> list[str]:
    """Run dir names, widened to ``parent/name`` where two runs share a name."""
    names = [p.name or str(p) for p in run_dirs]
    return [f"{p.parent.name}/{p.name}" if names.count(n) > 1 else n
            for p, n in zip(run_dirs, names, strict=True)]


def _has_data(runs: list[list[dict[str, Any]]], key: str) -> bool:
    return any(math.isfinite(v) for records in runs for v in _column(records, key)[1])


def figure_panels(spec: FigureSpec, runs: list[list[dict[str, Any]]]
                  ) -> list[tuple[str, tuple[Series, ...]]]:
    """The panels of ``spec`` worth drawing for ``runs``.

    Those with data that does not repeat an earlier panel's (same values at
    the same steps in every run).
    """
    kept: list[tuple[str, tuple[Series, ...]]] = []
    seen: list[list[tuple]] = []
    for ylabel, series in spec.panels:
        if not any(_has_data(runs, s.key) for s in series):
            continue
        data = [tuple(_column(records, s.key)) for s in series for records in runs]
        fingerprint = [(tuple(steps), tuple(round(v, 12) if math.isfinite(v) else None
                                            for v in values)) for steps, values in data]
        if fingerprint in seen:
            continue
        seen.append(fingerprint)
        kept.append((ylabel, series))
    return kept


def eval_marks(run_dir: str | os.PathLike[str], records: list[dict[str, Any]]
               ) -> list[tuple[str, int, float, float, float]]:
    """``(label, step, success, low, high)`` of the run's before/after evaluations.

    Before RL is placed at the run's first logged step (0 when it has none),
    after RL at its last; ``low``/``high`` are the 95% Wilson interval
    (``EpisodeSummary.success_interval``, recomputed for files written without it).
    """
    import json

    from sao_gym.evaluation import summary_interval

    steps = [r["step"] for r in records if "step" in r]
    marks = []
    for (name, label), step in zip(EVAL_FILES, (min(steps, default=0), max(steps, default=0)),
                                   strict=True):
        path = Path(run_dir) / name
        if not path.exists():
            continue
        summary = json.loads(path.read_text())
        lo, hi = summary_interval(summary)
        marks.append((f"held-out {label}", step, float(summary["success_rate"]), lo, hi))
    return marks


def _draw(spec: FigureSpec, runs: list[list[dict[str, Any]]], labels: list[str],
          smooth: float, path: Path, marks: list[list[tuple]] | None = None) -> bool:
    """Draw one figure to ``path``; False (nothing written) when no panel has data."""
    panels = figure_panels(spec, runs)
    if not panels:
        return False
    fig = Figure(figsize=(6.0 * len(panels), 4.0), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    colors = [f"C{i % 10}" for i in range(len(runs))]
    for ax, (ylabel, series) in zip(axes, panels, strict=True):
        for records, label, color in zip(runs, labels, colors, strict=True):
            for s in series:
                steps, values = _column(records, s.key)
                if not any(math.isfinite(v) for v in values):
                    continue
                name = f"{label} ({s.label})" if s.label else label
                if smooth > 0:
                    ax.plot(steps, values, color=color, linestyle=s.linestyle, alpha=0.25,
                            linewidth=1)
                    ax.plot(steps, smooth_ema(values, smooth), color=color,
                            linestyle=s.linestyle, label=name)
                else:
                    ax.plot(steps, values, color=color, linestyle=s.linestyle, label=name)
        if marks and any(s.key == SUCCESS_KEY for s in series):
            for run_marks, color in zip(marks, colors, strict=True):
                for (label, step, rate, lo, hi), shape in zip(run_marks, "os", strict=False):
                    # max(0): an interval stored by an older run may end within
                    # rounding inside its own rate (0.9999999999999999 for 1.0)
                    err = [[max(rate - lo, 0.0)], [max(hi - rate, 0.0)]]
                    ax.errorbar([step], [rate], yerr=err, fmt=shape,
                                color=color, capsize=4, markersize=7,
                                markerfacecolor="white" if shape == "o" else color,
                                label=f"{label} (95% CI)" if len(runs) == 1 else None)
        ax.set_xlabel("learner step")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    # a figure that lost a panel is titled by what it still shows
    fig.suptitle(spec.title if len(panels) == len(spec.panels)
                 else ", ".join(y for y, _ in panels).capitalize())
    fig.savefig(path, dpi=100)
    return True


def plot_runs(run_dir: str | os.PathLike[str], compare: Sequence[str | os.PathLike[str]] = (),
              out_dir: str | os.PathLike[str] | None = None, *,
              smooth: float = 0.0) -> list[Path]:
    """Write the PNG curves of ``run_dir`` (and of each run in ``compare``).

    Args:
        run_dir: a run directory holding ``metrics.jsonl``.
        compare: more run directories drawn in the same figures.
        out_dir: where the PNGs go; default ``run_dir/plots``.
        smooth: EMA weight in [0, 1); above 0 the raw curve is drawn faint
            under the smoothed one.

    Returns:
        The paths written, in :data:`FIGURES` order (figures without data are skipped).

    Raises:
        FileNotFoundError: a run dir has no ``metrics.jsonl``.
        ValueError: a ``metrics.jsonl`` is corrupt, or ``smooth`` is out of range.

    """
    if not 0.0 <= smooth < 1.0:
        raise ValueError(f"smooth must be in [0, 1), got {smooth}")
    run_dirs = [Path(run_dir), *(Path(p) for p in compare)]
    runs = [read_metrics(p) for p in run_dirs]
    out = Path(out_dir) if out_dir is not None else run_dirs[0] / "plots"
    out.mkdir(parents=True, exist_ok=True)
    labels = _labels(run_dirs)
    marks = [eval_marks(p, records) for p, records in zip(run_dirs, runs, strict=True)]
    written = []
    for spec in FIGURES:
        path = out / spec.filename
        if _draw(spec, runs, labels, smooth, path, marks):
            written.append(path)
    return written
