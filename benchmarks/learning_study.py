"""The paper's comparison in miniature: SAO against its baselines and ablations.

One command runs everything, two runs at a time (one torch thread each), and
picks up where it stopped when run again (finished runs are kept, an
interrupted run resumes from its last checkpoint)::

    .venv/bin/python benchmarks/learning_study.py --out runs/learning-study

1. **Warm starts**, one per seed: the supervised warm start of the study's
   recipe (``STUDY`` below), shared by every row of that seed, and its
   held-out evaluation (``eval_before.json``, copied into every run).
2. **Rows x seeds**: each row is ``sao-gym train STUDY.yaml --set ...`` from
   the seed's warm checkpoint, the same trajectory budget for all (``steps``
   x ``batch``), async with ``max_staleness`` 2 unless the row says sync.
3. **Stability**: ``--long-steps`` (1,000) steps of SAO and of GRPO without
   DIS at staleness 4, seed 0.
4. **Report**: ``OUT/table.md`` (final held-out success, mean and spread over
   seeds, and per seed against the first row on the same warm start; steps
   until the mean training success of the last 20 steps first reaches
   ``--threshold``; wall time) and ``OUT/plots/*.png``: per row, the mean over
   seeds (EMA-smoothed) of training success, clip ratio, explained variance,
   critic gradient norm, staleness and the learner's KL to the sampler
   (``mismatch/approx_kl``, every algorithm) (``baselines.png``: the paper's Table 1
   rows; ``ablations.png``: SAO against its ablations), and the long runs'
   curves (``long.png``).

``--rows`` and ``--seeds`` pick a subset; ``--report`` only redraws from what
has finished.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml
from _runs import loop_seconds

SAO_GYM = str(Path(sys.executable).with_name("sao-gym"))

STUDY = {
    # Arithmetic with all three operators (harder than the demo's additions) and the
    # demo's kind of warm start: a greedy held-out target with label smoothing, so the
    # sampled policy is sloppy and RL at temperature 1 has headroom to win.
    "algorithm": "sao", "mode": "async", "env": "sao_gym/Arithmetic-v0",
    "env_kwargs": {"operators": "+-*"}, "model": "tiny", "seed": 0,
    "total_steps": 300,
    "rollout": {"batch_size": 16, "group_size": 1, "concurrency": 16, "max_staleness": 2,
                "max_new_tokens": 24, "temperature": 1.0, "max_context_tokens": 512,
                "max_episode_steps": 4},
    "inference": {"backend": "hf", "max_batch_size": 32},
    "learner": {"lr": 2.0e-4, "critic_warmup_steps": 0, "lr_warmup_steps": 20,
                "lr_schedule": "linear"},
    "warm_start": {"steps": 1500, "episodes": 2048, "lr": 3.0e-3, "batch_size": 16,
                   "target_success": 0.6, "target_metric": "greedy", "holdout_episodes": 64,
                   "label_smoothing": 0.1},
    "eval": {"episodes": 256},
    "checkpoint": {"every": 25, "keep": 1},
    "logging": {"loggers": "jsonl"},
}
"""The study's recipe; rows change it with ``--set`` overrides."""

GROUP = ["rollout.group_size=8"]
ROWS: dict[str, list[str]] = {
    "SAO": [],
    "GRPO+DIS (G=8)": ["algorithm=grpo_dis", *GROUP],
    "GRPO (G=8, PPO clip)": ["algorithm=grpo", *GROUP],
    "VAPO-style (critic, PPO clip)": ["algorithm=vapo"],
    "running-mean baseline (DIS)": ["algorithm=running_mean"],
    "SAO, K=1 critic step": ["learner.critic_updates=1"],
    "SAO, full-parameter critic": ["learner.critic_freeze=null"],
    "SAO, sync": ["mode=sync"],
    "SAO, 2-layer critic": ["learner.critic_layers=2"],
}
"""Row name -> overrides of :data:`STUDY` (the paper's Tables 1, 3 and 4 in miniature,
and a cheaper critic: the first 2 of the policy's 4 layers, ``learner.critic_layers``)."""

BASELINE_ROWS = ("SAO", "GRPO+DIS (G=8)", "GRPO (G=8, PPO clip)", "VAPO-style (critic, PPO clip)",
                 "running-mean baseline (DIS)")
"""The rows of the paper's Table 1 (the others are ablations of SAO: Tables 3 and 4)."""

LONG_ROWS = {"SAO, staleness 4": ["rollout.max_staleness=4"],
             "GRPO (PPO clip, no DIS), staleness 4": ["algorithm=grpo", *GROUP,
                                                      "rollout.max_staleness=4"]}

CURVES = [("rollout/success_rate", "training success"), ("sao/clip_ratio", "clip ratio"),
          ("critic/explained_variance", "explained variance"),
          ("critic/grad_norm", "critic grad norm"), ("async/staleness_mean", "staleness (mean)"),
          ("mismatch/approx_kl", "KL(sampler || policy)")]


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-").replace("--", "-")


def log(text: str) -> None:
    print(time.strftime("%H:%M:%S ") + text, flush=True)


def one_thread_env() -> dict[str, str]:
    """The environment of a study's ``sao-gym`` processes: one torch thread each."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def sao_gym(args: list[str], logfile: Path) -> None:
    """Run ``sao-gym ARGS`` with one torch thread, its output to ``logfile``."""
    env = one_thread_env()
    with logfile.open("a") as f:
        done = subprocess.run([SAO_GYM, *args], stdout=f, stderr=subprocess.STDOUT, env=env,
                              check=False)
    if done.returncode:
        raise RuntimeError(f"sao-gym {' '.join(args[:3])} ... failed (exit {done.returncode}); "
                           f"see {logfile}")


def warm_done(out: Path, seed: int) -> bool:
    """Whether the seed's warm start is there (checkpoint and evaluation)."""
    run = out / "warm" / f"seed{seed}"
    return ((run / "eval_before.json").exists()
            and (run / "model" / "warm_start" / "config.json").exists())


def warm_start(out: Path, seed: int) -> Path:
    """The seed's warm checkpoint and its held-out evaluation (made once; an
    interrupted one is resumed from its last saved state)."""
    from sao_gym.runtime.prepare.start import DEMONSTRATIONS, WARM_STATE

    run = out / "warm" / f"seed{seed}"
    if warm_done(out, seed):
        return run
    model = run / "model"
    if (run / "config.yaml").exists() and ((model / WARM_STATE / DEMONSTRATIONS).exists()
                                           or (model / "warm_start" / "config.json").exists()):
        log(f"resume warm start, seed {seed}")
        sao_gym(["train", "--resume", str(run)], out / "logs" / f"warm-seed{seed}.log")
        return run
    if run.exists():
        shutil.rmtree(run)
    log(f"warm start, seed {seed}")
    # total_steps=1 with checkpoints off: the job warm-starts and evaluates; the one
    # RL step it then takes is never used.
    sao_gym(["train", str(out / "study.yaml"), "--out", str(run), "--set", f"seed={seed}",
             "--set", "total_steps=1", "--set", "checkpoint.every=0"],
            out / "logs" / f"warm-seed{seed}.log")
    return run


def train(out: Path, warm: Path, name: str, overrides: list[str], seed: int,
          steps: int) -> Path:
    """One row x seed run from the seed's warm checkpoint; resumes an interrupted one."""
    run = out / "runs" / slug(name) / f"seed{seed}"
    if (run / "eval_after.json").exists():
        return run
    logfile = out / "logs" / f"{slug(name)}-seed{seed}.log"
    if run.exists() and any((run / "checkpoints").glob("step_*")):
        log(f"resume {name}, seed {seed}")
        sao_gym(["train", "--resume", str(run)], logfile)
        return run
    if run.exists():
        shutil.rmtree(run)
    run.mkdir(parents=True)
    shutil.copy(warm / "eval_before.json", run / "eval_before.json")  # the same start for all
    log(f"start {name}, seed {seed}")
    sets = [f"seed={seed}", f"model={warm / 'model' / 'warm_start'}", "warm_start=null",
            f"total_steps={steps}", *overrides]
    sao_gym(["train", str(out / "study.yaml"), "--out", str(run),
             *[a for kv in sets for a in ("--set", kv)]], logfile)
    log(f"done {name}, seed {seed}")
    return run


# ---------- report ----------

def _records(run: Path) -> list[dict]:
    from sao_gym.logging import read_metrics

    return read_metrics(run) if (run / "metrics.jsonl").exists() else []


def _ema(values: list[float | None], w: float = 0.9) -> list[float]:
    from sao_gym.plotting import smooth_ema

    return smooth_ema([math.nan if v is None else float(v) for v in values], w)


WINDOW = 20
"""Steps in the trailing mean of training success that "steps to threshold" reads."""


def steps_to(records: list[dict], threshold: float, window: int = WINDOW) -> int | None:
    """First learner step where the mean training success of the last ``window`` steps
    reaches ``threshold`` (a trailing mean: one lucky batch at the start does not count)."""
    pts = [(r["step"], r.get("rollout/success_rate")) for r in records]
    pts = [(s, v) for s, v in pts if v is not None and math.isfinite(v)]
    for i in range(window - 1, len(pts)):
        if statistics.mean(v for _, v in pts[i - window + 1:i + 1]) >= threshold:
            return pts[i][0]
    return None


def _spread(xs: list[float]) -> str:
    if not xs:
        return "-"
    if len(xs) == 1:
        return f"{xs[0]:.3f}"
    return f"{statistics.mean(xs):.3f} ± {statistics.stdev(xs):.3f}"


def row_summary(out: Path, name: str, seeds: list[int], threshold: float) -> dict:
    runs = [out / "runs" / slug(name) / f"seed{s}" for s in seeds]
    done = [r for r in runs if (r / "eval_after.json").exists()]
    finals = [json.loads((r / "eval_after.json").read_text())["success_rate"] for r in done]
    starts = [json.loads((r / "eval_before.json").read_text())["success_rate"] for r in done]
    reach = [steps_to(_records(r), threshold) for r in done]
    walls = []
    for r in done:
        recs = _records(r)
        if recs and "time/elapsed_s" in recs[-1]:
            walls.append(loop_seconds(recs) / 60)
    return {"row": name, "seeds_done": len(done), "seeds": [int(r.name[4:]) for r in done],
            "final": finals, "start": starts,
            "steps_to_threshold": reach, "wall_min": walls}


def _vs_first(summary: dict, first: dict) -> str:
    """Per seed, final success minus the first row's on the same seed (same warm start)."""
    base = dict(zip(first["seeds"], first["final"], strict=True))
    diffs = [f"{f - base[seed]:+.3f}" for seed, f in zip(summary["seeds"], summary["final"],
                                                         strict=True) if seed in base]
    return ", ".join(diffs) or "-"


def table(summaries: list[dict], threshold: float, budget: str) -> str:
    first = summaries[0]["row"]
    lines = [f"Held-out success at T=1 (256 episodes per run) after {budget}; mean ± sd over "
             f"seeds; vs {first}: final success minus {first}'s on the same seed (same warm "
             f"start), per seed. Steps to {threshold:.2f}: first learner step where the "
             f"mean training success of the last {WINDOW} steps reaches it (— if never), per "
             "seed. Wall: median.",
             "", f"| row | seeds | start | final | gain | vs {first} | steps to threshold | "
             "wall (min) |", "|---|---|---|---|---|---|---|---|"]
    for s in summaries:
        gains = [f - b for f, b in zip(s["final"], s["start"], strict=True)]
        reach = ", ".join("—" if x is None else str(x) for x in s["steps_to_threshold"]) or "-"
        wall = f"{statistics.median(s['wall_min']):.1f}" if s["wall_min"] else "-"
        lines.append(f"| {s['row']} | {s['seeds_done']} | {_spread(s['start'])} | "
                     f"{_spread(s['final'])} | {_spread(gains)} | {_vs_first(s, summaries[0])} "
                     f"| {reach} | {wall} |")
    return "\n".join(lines)


def plot(out: Path, groups: dict[str, list[Path]], filename: str, title: str) -> Path | None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    cols = 3
    rows = -(-len(CURVES) // cols)
    fig = Figure(figsize=(5.0 * cols, 3.6 * rows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = list(fig.subplots(rows, cols, squeeze=False).flat)
    for ax in axes[len(CURVES):]:
        ax.set_visible(False)
    axes = axes[:len(CURVES)]
    drawn = False
    for i, (name, runs) in enumerate(groups.items()):
        series = [_records(r) for r in runs]
        series = [s for s in series if s]
        if not series:
            continue
        for ax, (key, label) in zip(axes, CURVES, strict=True):
            by_step: dict[int, list[float]] = {}
            for recs in series:
                for r in recs:
                    v = r.get(key)
                    if v is not None and math.isfinite(v):
                        by_step.setdefault(r["step"], []).append(v)
            if not by_step:
                continue
            steps = sorted(by_step)
            mean = [statistics.mean(by_step[s]) for s in steps]
            ax.plot(steps, mean, color=f"C{i % 10}", alpha=0.2, linewidth=1)
            ax.plot(steps, _ema(mean), color=f"C{i % 10}", label=name)
            ax.set_title(label)
            ax.set_xlabel("learner step")
            ax.grid(True, alpha=0.3)
            drawn = True
    if not drawn:
        return None
    axes[0].legend(fontsize="x-small")
    fig.suptitle(title)
    path = out / "plots" / filename
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    return path


def report(out: Path, rows: list[str], seeds: list[int], threshold: float, steps: int,
           long_steps: int) -> None:
    batch = STUDY["rollout"]["batch_size"]
    summaries = [row_summary(out, name, seeds, threshold) for name in rows]
    text = table(summaries, threshold, f"{steps} steps x {batch} trajectories")
    longs = [row_summary(out, name, [0], threshold) for name in LONG_ROWS]
    text += "\n\n" + table(longs, threshold, f"{long_steps} steps x {batch} trajectories, "
                           "staleness 4")
    (out / "table.md").write_text(text + "\n")
    (out / "summary.json").write_text(json.dumps(summaries + longs, indent=2))
    print(text)
    def runs_of(names: list[str]) -> dict[str, list[Path]]:
        return {n: [out / "runs" / slug(n) / f"seed{s}" for s in seeds] for n in names}

    baselines = [n for n in rows if n in BASELINE_ROWS]
    ablations = [n for n in rows if n not in BASELINE_ROWS or n == "SAO"]
    mean_of = f"mean over seeds {seeds} (EMA 0.9 over the faint mean)"
    plots = [plot(out, runs_of(baselines), "baselines.png", f"SAO and its baselines, {mean_of}"),
             plot(out, runs_of(ablations), "ablations.png", f"SAO's ablations, {mean_of}"),
             plot(out, {n: [out / "runs" / slug(n) / "seed0"] for n in LONG_ROWS},
                  "long.png", f"{long_steps} steps at staleness 4, seed 0")]
    for p in plots:
        if p:
            print(f"plot: {p}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS),
                   metavar="ROW", help=f"default: all of {list(ROWS)}")
    p.add_argument("--steps", type=int, default=STUDY["total_steps"])
    p.add_argument("--long-steps", type=int, default=1000, help="0: skip the long runs")
    p.add_argument("--parallel", type=int, default=2)
    p.add_argument("--threshold", type=float, default=0.25,
                   help="training success for the steps-to-threshold column")
    p.add_argument("--report", action="store_true", help="only write the table and plots")
    args = p.parse_args(argv)
    out: Path = args.out
    (out / "logs").mkdir(parents=True, exist_ok=True)
    study = out / "study.yaml"
    if not study.exists():
        study.write_text(yaml.safe_dump(STUDY, sort_keys=False))
    elif yaml.safe_load(study.read_text()) != STUDY:
        raise SystemExit(f"{study} differs from this script's STUDY: use another --out")
    if not args.report:
        with ThreadPoolExecutor(args.parallel) as pool:
            warms = dict(zip(args.seeds, pool.map(lambda s: warm_start(out, s), args.seeds),
                             strict=True))
            jobs = [(name, ROWS[name], seed, args.steps)
                    for seed in args.seeds for name in args.rows]
            if args.long_steps:
                warms.setdefault(0, warm_start(out, 0))
                jobs += [(name, sets, 0, args.long_steps) for name, sets in LONG_ROWS.items()]
            futures = [pool.submit(train, out, warms[seed], name, sets, seed, steps)
                       for name, sets, seed, steps in jobs]
            for f in futures:
                f.result()
    report(out, args.rows, args.seeds, args.threshold, args.steps, args.long_steps)


if __name__ == "__main__":
    main()
