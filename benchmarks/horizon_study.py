"""The thesis at horizon: does SAO's critic pay as the horizon grows?

SAO, the running-mean baseline (single rollout, DIS; a per-task window, which
on KeyChain's fresh tasks is no baseline, and the global 128-reward window),
GRPO + DIS and GRPO without DIS (PPO clip) on ``sao_gym/KeyChain-v0`` at a
short and a long horizon, the same trajectory budget for every row, three seeds;
at the long horizon also SAO with ``learner.bootstrap_truncated`` on. One command,
resumable like ``learning_study.py`` (whose runner it uses: finished runs are
kept, an interrupted run resumes from its last checkpoint)::

    .venv/bin/python benchmarks/horizon_study.py --out runs/horizon-study

1. **Warm starts**, one per seed and horizon: the generic CPU recipe's
   supervised warm start (``sao_gym/recipes/cpu.yaml``: the tiny model, a
   tokenizer trained on the env's text, imitation of the oracle to a greedy
   held-out target, label smoothing fitted to the horizon's episodes) at that
   horizon. (A short-horizon warm start samples 32-hop episodes with success
   0/256: its per-turn slips compound over 33 turns, and a row without a
   single reward has nothing to learn from. Fitted per horizon, both start
   near the same sampled success.)
2. **Rows x horizons x seeds**, ``sao-gym train`` from the seed's warm
   checkpoint of that horizon (``--set`` overrides of the horizon's recipe),
   ``STEPS[horizon]`` learner steps of 16 trajectories each.
3. **The critic along an episode**: the final SAO critic of each seed at
   each horizon scores ``--value-episodes`` held-out episodes of its policy;
   the value at the start of each turn (the state before its first action
   token), averaged over solved and failed episodes separately.
4. **Report** (``OUT/table.md``, ``OUT/summary.json``, ``OUT/plots/``): per
   horizon, final held-out success (mean ± sd over seeds, and each run's 95%
   Wilson interval), per seed against SAO on the same warm start; SAO's margin
   over the running-mean baseline per horizon; curves (training success,
   explained variance, clip ratio, ...); V per turn, solved vs failed.

``--rows``, ``--horizons`` and ``--seeds`` pick a subset; ``--report`` only
redraws from what has finished. ``--archive DIR`` keeps every finished run's
small files (config, evaluations, critic values, gzipped metrics) in DIR, and
each warm start (its checkpoint, ~2.5 MB) while a run of it is unfinished, and
restores them into ``--out`` first, so a study too long for one sitting spreads
over several. An archive keeps each horizon's ``study.yaml`` (the recipe its
runs were made with) and is refused by a study of another recipe
(:func:`check_archive`): rows are only paired with rows of the same warm starts.
(The checked-in ``docs/data/horizon_study`` predates the marks and the curriculum;
``benchmarks/report.py`` regenerates its tables.)
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import statistics
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parent))
import learning_study as ls  # noqa: E402  (the study runner: warm starts, runs, tables)

HORIZONS = {"short": 8, "long": 32}
"""Horizon name -> hops (turns needed: hops + 1; the env allows max(2, hops // 4) more)."""

STEPS = {"short": 200, "long": 100}
"""Learner steps per run: the same trajectory budget for every row of a horizon. A
32-hop step costs ~5x an 8-hop one on 2 cores (~70 min for 200 steps), so the long
horizon gets half the trajectories (still ~2x the tokens)."""
BATCH = 16


def recipe(hops: int, steps: int = STEPS["short"]) -> dict:
    """The generic CPU recipe on KeyChain at ``hops`` (token budgets set: see the docs)."""
    base = yaml.safe_load((Path(ls.__file__).parents[1] / "sao_gym" / "recipes"
                           / "cpu.yaml").read_text())
    base.update({"env": "sao_gym/KeyChain-v0", "env_kwargs": {"hops": hops},
                 "total_steps": steps, "eval": {"episodes": 256},
                 "checkpoint": {"every": 25, "keep": 1}})
    # The warm start fits the turn budget to its short chains; the context is capped at
    # the tiny model's 4,096 positions for every horizon (the env's own turn budget
    # bounds an episode; a 32-hop episode that uses all of it is ~1,500 tokens).
    base["rollout"].update({"batch_size": BATCH, "max_context_tokens": 4096})
    return base


GROUP = ["rollout.group_size=8"]
ROWS: dict[str, list[str]] = {
    "SAO": [],
    # The per-task window (the paper's ablation: 8 rewards of the same task) is empty on
    # KeyChain, whose every episode is a new chain: its baseline stays 0 and the row is
    # REINFORCE without a baseline (``baseline/with_history`` 0). The global window
    # (the paper's online experiment: the last 128 rewards) is the critic-free baseline
    # that a stream of fresh tasks allows.
    "running-mean baseline (DIS)": ["algorithm=running_mean"],
    "running-mean baseline, global 128 (DIS)": [
        "algorithm=running_mean", "learner.running_mean_per_prompt=false",
        "learner.running_mean_window=128"],
    "GRPO+DIS (G=8)": ["algorithm=grpo_dis", *GROUP],
    "GRPO (G=8, PPO clip, no DIS)": ["algorithm=grpo", *GROUP],
}
LONG_ONLY = {"SAO, bootstrap truncated": ["learner.bootstrap_truncated=true"]}
"""Rows run at the long horizon only."""


def rows_at(horizon: str) -> dict[str, list[str]]:
    return {**ROWS, **(LONG_ONLY if horizon == "long" else {})}


def horizon_dir(out: Path, horizon: str) -> Path:
    path = out / horizon
    (path / "logs").mkdir(parents=True, exist_ok=True)
    study = path / "study.yaml"
    want = recipe(HORIZONS[horizon], STEPS[horizon])
    if not study.exists():
        study.write_text(yaml.safe_dump(want, sort_keys=False))
    elif yaml.safe_load(study.read_text()) != want:
        raise SystemExit(f"{study} differs from this script's recipe: use another --out")
    return path


def job_order(horizons: list[str], seeds: list[int], rows: list[str]
              ) -> list[tuple[str, str, int]]:
    """``(horizon, row, seed)`` of every run, row by row over the warm starts.

    A warm start is one process on one core; the runs that need it wait for it.
    Taking the warm starts in turn for each row lets the pool's workers make
    different warm starts side by side, instead of all waiting on the first.
    """
    names = [*ROWS, *LONG_ONLY]
    return [(h, name, seed) for name in names if name in rows
            for h in horizons for seed in seeds if name in rows_at(h)]


class Jobs:
    """Hands the study's runs to the pool's workers, in :func:`job_order`, never idly.

    A warm start is one process on one core, made by the worker that first takes
    a run of it. Another worker skips the runs that wait on a warm start being
    made and takes the first run it can start now (its warm start made, or one
    no one is making); only when every run left waits on a warm start being made
    does it wait. (Handed out strictly in order, a worker would sit out a 32-hop
    warm start of up to 85 minutes beside the worker making it.)
    """

    def __init__(self, jobs: list[tuple[str, str, int]], ready: set[tuple[str, int]] = frozenset()):
        self.todo = list(jobs)
        self.ready = set(ready)
        """``(horizon, seed)`` whose warm start is there."""
        self.making: set[tuple[str, int]] = set()
        """``(horizon, seed)`` whose warm start a worker is making."""
        self._changed = threading.Condition()

    def take(self) -> tuple[str, str, int] | None:
        """The next run to start (see above); None when none is left."""
        with self._changed:
            while self.todo:
                for job in self.todo:
                    key = (job[0], job[2])
                    if key in self.ready or key not in self.making:
                        self.todo.remove(job)
                        if key not in self.ready:
                            self.making.add(key)
                        return job
                self._changed.wait()
            return None

    def warm_ready(self, horizon: str, seed: int) -> None:
        """The warm start of ``(horizon, seed)`` is no longer being made."""
        with self._changed:
            if (horizon, seed) in self.making:
                self.making.discard((horizon, seed))
                self.ready.add((horizon, seed))
            self._changed.notify_all()


_WARM_LOCKS: dict[tuple[str, int], threading.Lock] = {}


def run_row(out: Path, horizon: str, name: str, seed: int, steps: int,
            archive: Path | None = None, value_episodes: int = 128,
            on_warm: Callable[[str, int], None] | None = None) -> Path:
    """One row x seed at ``horizon`` from the seed's warm checkpoint of that horizon.

    A finished run is kept (and its warm start not remade); with ``archive``, a
    finished run's small files go there (the SAO row's critic values first).
    ``on_warm(horizon, seed)`` is called once the warm start is there.
    """
    run = out / horizon / "runs" / ls.slug(name) / f"seed{seed}"
    if not (run / "eval_after.json").exists():
        with _WARM_LOCKS.setdefault((horizon, seed), threading.Lock()):  # made once
            warm = ls.warm_start(out / horizon, seed)
            if archive is not None:
                keep_warm(warm, archive / warm.relative_to(out))
        if on_warm is not None:
            on_warm(horizon, seed)
        fitted = yaml.safe_load((warm / "config.yaml").read_text())["rollout"]
        sets = [*rows_at(horizon)[name], f"rollout.max_new_tokens={fitted['max_new_tokens']}"]
        run = ls.train(out / horizon, warm, name, sets, seed, steps)
    if not (run / "eval_after.json").exists():  # stopped (SIGTERM): resumed next time
        ls.log(f"{name}, seed {seed}: stopped before its end, not archived")
        return run
    if name == "SAO":
        values_file(out, horizon, seed, value_episodes)
    if archive is not None:
        keep(run, archive / run.relative_to(out))
    return run


KEPT = ("config.yaml", "eval_before.json", "eval_after.json", "turn_values.json")
"""A finished run's files :func:`keep` archives (and its metrics, gzipped)."""


def keep(run: Path, dest: Path) -> None:
    """Copy a finished run's small files to ``dest`` (metrics as ``metrics.jsonl.gz``)."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in KEPT:
        if (run / name).exists():
            shutil.copy(run / name, dest / name)
    with (run / "metrics.jsonl").open("rb") as f, (dest / "metrics.jsonl.gz").open("wb") as raw, \
            gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as g:  # the same bytes every time
        shutil.copyfileobj(f, g)


WARM_KEPT = ("config.yaml", "eval_before.json")
"""A warm start's files :func:`keep_warm` archives, with its checkpoint ``model/warm_start``."""


def keep_warm(warm: Path, dest: Path) -> None:
    """Archive a warm start (its fitted config, evaluation and checkpoint, ~2.5 MB).

    It stays in the archive while a run of it is unfinished (:func:`drop_warm`), so a
    study that spans sessions does not remake it: a 32-hop warm start takes 30-85 min.
    """
    if (dest / "model" / "warm_start" / "config.json").exists():
        return
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(warm / "model" / "warm_start", tmp / "model" / "warm_start")
    for name in WARM_KEPT:
        shutil.copy(warm / name, tmp / name)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)


def drop_warm(archive: Path, horizon: str, seeds: list[int]) -> None:
    """Remove archived warm starts of ``horizon`` whose every row has finished."""
    for seed in seeds:
        warm = archive / horizon / "warm" / f"seed{seed}"
        done = all((archive / horizon / "runs" / ls.slug(name) / f"seed{seed}"
                    / "eval_after.json").exists() for name in rows_at(horizon))
        if done and warm.exists():
            shutil.rmtree(warm)


def check_archive(archive: Path, out: Path, horizon: str) -> None:
    """The archive of ``horizon`` holds runs of this study's recipe, or none yet (it is marked).

    Each horizon of an archive keeps the ``study.yaml`` its runs were made with; an
    archive of another recipe (or one kept before archives were marked) is refused,
    so that rows restored from it are never paired with rows of this recipe.
    """
    kept, want = archive / horizon, (out / horizon / "study.yaml").read_text()
    if (kept / "study.yaml").exists():
        if yaml.safe_load((kept / "study.yaml").read_text()) != yaml.safe_load(want):
            raise SystemExit(f"{kept} holds runs of another recipe ({kept / 'study.yaml'} "
                             "differs from this script's): archive this study elsewhere")
        return
    if any(kept.glob("*/*/seed*")):
        raise SystemExit(f"{kept} holds runs of an unrecorded recipe (no study.yaml): "
                         "archive this study elsewhere")
    kept.mkdir(parents=True, exist_ok=True)
    (kept / "study.yaml").write_text(want)


def restore(archive: Path, out: Path) -> int:
    """Bring archived finished runs and warm starts back into ``out`` (where missing).

    Returns how many finished runs were restored.
    """
    for kept in archive.glob("*/warm/seed*/model/warm_start/config.json"):
        src = kept.parents[2]
        dest = out / src.relative_to(archive)
        if not (dest / "model" / "warm_start" / "config.json").exists():
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(src, dest)
    n = 0
    for done in archive.glob("*/runs/*/seed*/eval_after.json"):
        src = done.parent
        dest = out / src.relative_to(archive)
        if (dest / "eval_after.json").exists():
            continue
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        for name in KEPT:
            if (src / name).exists():
                shutil.copy(src / name, dest / name)
        with gzip.open(src / "metrics.jsonl.gz", "rb") as g, (dest / "metrics.jsonl").open(
                "wb") as f:
            shutil.copyfileobj(g, f)
        n += 1
    return n


# ---------- the critic along an episode ----------

def turn_values(run: Path, episodes: int) -> dict:
    """Mean critic value at the start of each turn, solved vs failed episodes."""
    import asyncio

    import torch

    from sao_gym.evaluation import run_episodes
    from sao_gym.learner.critic import ValueModel
    from sao_gym.learner.state import read_state
    from sao_gym.runtime.config.build import rollout_factory
    from sao_gym.runtime.config.loader import load_config
    from sao_gym.runtime.plans import EVAL_SEED

    config = load_config(run / "config.yaml")
    last = max((run / "checkpoints").glob("step_*"), key=lambda p: int(p.name[5:]))
    factory = rollout_factory(config, temperature=config.rollout.temperature)

    async def play() -> list:
        parts = factory(str(last / "policy"), seed=EVAL_SEED + 7, run_dir=run)
        try:
            return await run_episodes(parts.make_env, parts.make_agent, episodes,
                                      concurrency=config.rollout.concurrency,
                                      seed=EVAL_SEED + 7, seed_agents=True)
        finally:
            await parts.aclose()

    rollouts = [r for r in asyncio.run(play()) if not r.infra_failure and r.token_ids]
    critic = ValueModel.from_pretrained(last / "policy", num_layers=config.learner.critic_layers)
    critic.load_state_dict(read_state(last)["critic"])
    critic.eval()
    out: dict[str, list[list[float]]] = {"solved": [], "failed": []}
    with torch.no_grad():
        for r in rollouts:
            ids = torch.tensor([r.token_ids])
            after = critic.values_after(ids, torch.ones_like(ids))[0].tolist()
            starts = [t for t in range(1, len(r.loss_mask))
                      if r.loss_mask[t] and not r.loss_mask[t - 1]]
            out["solved" if r.reward >= 1 else "failed"].append([after[t - 1] for t in starts])
    return out


def values_file(out: Path, horizon: str, seed: int, episodes: int) -> Path | None:
    run = out / horizon / "runs" / ls.slug("SAO") / f"seed{seed}"
    path = run / "turn_values.json"
    if not path.exists() and (run / "eval_after.json").exists():
        ls.log(f"critic values along episodes: {horizon}, seed {seed}")
        path.write_text(json.dumps(turn_values(run, episodes)))
    return path if path.exists() else None


def plot_values(out: Path, files: dict[str, list[Path]]) -> Path | None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.0 * len(files), 4.0), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(files), squeeze=False)[0]
    drawn = False
    for ax, (horizon, paths) in zip(axes, files.items(), strict=True):
        for color, p in enumerate(paths):  # one colour a seed: pooled, seeds' levels mix
            values = json.loads(p.read_text())
            for kind, style in (("solved", "-"), ("failed", "--")):
                per_turn: dict[int, list[float]] = {}
                for episode in values[kind]:
                    for t, v in enumerate(episode):
                        per_turn.setdefault(t + 1, []).append(v)
                turns = sorted(t for t in per_turn if len(per_turn[t]) >= 5)
                if not turns:
                    continue
                ax.plot(turns, [statistics.mean(per_turn[t]) for t in turns], style,
                        color=f"C{color}",
                        label=f"{p.parent.name} {kind} ({len(values[kind])})")
                drawn = True
        ax.set_title(f"{horizon} horizon ({HORIZONS[horizon]} hops): final SAO critic")
        ax.set_xlabel("turn")
        ax.set_ylabel("V at the turn's start")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small", ncol=2)
    if not drawn:
        return None
    path = out / "plots" / "values_per_turn.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    return path


# ---------- report ----------

def wilson(p: float, n: int = 256) -> tuple[float, float]:
    """95% interval of a success rate ``p`` over ``n`` episodes (the recipe's 256)."""
    from sao_gym.evaluation import wilson_interval

    return wilson_interval(round(p * n), n)


def report(out: Path, horizons: list[str], rows: list[str], seeds: list[int],
           steps_of: dict[str, int], value_episodes: int) -> None:
    text, summaries = [], {}
    for horizon in horizons:
        hdir = out / horizon
        names = [n for n in rows_at(horizon) if n in rows]
        rs = [ls.row_summary(hdir, n, seeds, 0.25) for n in names]
        steps = steps_of.get(horizon, STEPS[horizon])
        summaries[horizon] = rs
        text.append(f"## {horizon} horizon: {HORIZONS[horizon]} hops\n")
        text.append(ls.table(rs, 0.25, f"{steps} steps x {BATCH} trajectories"))
        text.append("\nPer run, final success with its 95% interval (256 episodes):\n")
        for s in rs:
            runs = ", ".join(f"seed {seed}: {f:.3f} [{wilson(f)[0]:.3f}, {wilson(f)[1]:.3f}]"
                             for seed, f in zip(s["seeds"], s["final"], strict=True))
            text.append(f"- {s['row']}: {runs or '-'}")
        by = {s["row"]: dict(zip(s["seeds"], s["final"], strict=True)) for s in rs}
        sao = by.get("SAO", {})
        for row in ("running-mean baseline (DIS)", "running-mean baseline, global 128 (DIS)"):
            rm = by.get(row, {})
            margins = [sao[k] - rm[k] for k in sorted(set(sao) & set(rm))]
            if margins:
                text.append(f"\nSAO minus the {row}, per seed: "
                            f"{', '.join(f'{m:+.3f}' for m in margins)} (mean "
                            f"{statistics.mean(margins):+.3f})\n")
        groups = {n: [hdir / "runs" / ls.slug(n) / f"seed{s}" for s in seeds] for n in names}
        p = ls.plot(hdir, groups, f"{horizon}.png",
                    f"KeyChain, {HORIZONS[horizon]} hops: mean over seeds {seeds}")
        if p:
            text.append(f"![{horizon}]({p})\n")
    files = {h: [f for s in seeds if (f := values_file(out, h, s, value_episodes))]
             for h in horizons}
    files = {h: fs for h, fs in files.items() if fs}
    if files:
        p = plot_values(out, files)
        if p:
            text.append(f"![V per turn]({p})\n")
    (out / "table.md").write_text("\n".join(text) + "\n")
    (out / "summary.json").write_text(json.dumps(summaries, indent=2))
    print("\n".join(text))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--horizons", nargs="+", default=list(HORIZONS), choices=list(HORIZONS))
    p.add_argument("--rows", nargs="+", default=[*ROWS, *LONG_ONLY],
                   choices=[*ROWS, *LONG_ONLY], metavar="ROW")
    p.add_argument("--steps", type=int, default=None,
                   help="learner steps of every run (default: STEPS of each horizon)")
    p.add_argument("--parallel", type=int, default=2)
    p.add_argument("--value-episodes", type=int, default=128)
    p.add_argument("--report", action="store_true", help="only write the table and plots")
    p.add_argument("--archive", type=Path, default=None,
                   help="keep finished runs' small files here and resume from them (a "
                        "study spread over machines or sessions; e.g. docs/data/horizon_study)")
    args = p.parse_args(argv)
    steps_of = {h: args.steps or STEPS[h] for h in args.horizons}
    for h in args.horizons:
        horizon_dir(args.out, h)
    if args.archive is not None:
        for h in args.horizons:
            check_archive(args.archive, args.out, h)
        ls.log(f"{restore(args.archive, args.out)} finished runs restored from {args.archive}")
    if not args.report:
        jobs = Jobs(job_order(args.horizons, args.seeds, args.rows),
                    ready={(h, seed) for h in args.horizons for seed in args.seeds
                           if ls.warm_done(args.out / h, seed)})

        def worker() -> None:
            while (job := jobs.take()) is not None:
                h, name, seed = job
                try:
                    run_row(args.out, h, name, seed, steps_of[h], args.archive,
                            args.value_episodes, on_warm=jobs.warm_ready)
                finally:
                    jobs.warm_ready(h, seed)  # made, found, or failed: no one waits on it

        with ThreadPoolExecutor(args.parallel) as pool:
            for f in [pool.submit(worker) for _ in range(args.parallel)]:
                f.result()
        if args.archive is not None:
            for h in args.horizons:
                drop_warm(args.archive, h, args.seeds)
    report(args.out, args.horizons, args.rows, args.seeds, steps_of, args.value_episodes)


if __name__ == "__main__":
    main()
