"""Regenerate the docs' tables from their raw data in docs/data.

A generated table sits in a markdown file between two markers naming its
generator::

    <!-- report: horizon_long -->
    | row | ... |
    <!-- /report -->

``python benchmarks/report.py`` rewrites every such block of docs/results.md
and docs/benchmarks.md from docs/data; ``--check`` rewrites nothing and exits
1 naming each block that differs from what its data gives (a test runs it).
Each generator (:data:`GENERATORS`) reads only files under docs/data, so a
table is exactly what its raw data says.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

from sao_gym.evaluation import gain_interval, wilson_interval

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "data"
DOCS = [ROOT / "docs" / "results.md", ROOT / "docs" / "benchmarks.md"]
BLOCK = re.compile(r"(<!-- report: (\w+) -->\n)(.*?)(<!-- /report -->)", re.S)


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def _metrics(run: Path) -> list[dict]:
    with gzip.open(run / "metrics.jsonl.gz", "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def _loop_minutes(records: list[dict]) -> float:
    """Minutes of the training loop: the sum of each resumed part's last elapsed time."""
    total, last = 0.0, 0.0
    for r in records:
        t = r.get("time/elapsed_s", 0.0)
        if t < last:  # a resumed part's clock starts again
            total += last
        last = t
    return (total + last) / 60


def _spread(xs: list[float]) -> str:
    return (f"{xs[0]:.3f}" if len(xs) == 1 else
            f"{statistics.mean(xs):.3f} ± {statistics.stdev(xs):.3f}")


def _cell(success: float, n: int) -> str:
    lo, hi = wilson_interval(round(success * n), n)
    return f"{success:.3f} [{lo:.3f}, {hi:.3f}]"


HORIZON_ROWS = {
    "sao": "SAO",
    "running-mean-baseline-dis": "running-mean baseline, per-task window (DIS): no baseline here",
    "running-mean-baseline-global-128-dis": "running-mean baseline, global 128 (DIS)",
    "grpo-dis-g-8": "GRPO + DIS (G = 8)",
    "grpo-g-8-ppo-clip-no-dis": "GRPO, PPO clip, no DIS (G = 8)",
    "sao-bootstrap-truncated": "SAO, truncation bootstrapped",
}


def _horizon_runs(horizon: str) -> dict[str, dict[int, Path]]:
    base = DATA / "horizon_study" / horizon / "runs"
    return {row: {int(p.name[4:]): p for p in sorted((base / row).glob("seed*"))
                  if (p / "eval_after.json").exists()}
            for row in HORIZON_ROWS if (base / row).is_dir()}


def _unpaired(runs: dict[int, Path], first: dict[int, Path], seed: int) -> bool:
    """Whether the run of ``seed`` started elsewhere than the first row's (another warm start)."""
    if seed not in first:
        return False
    start = _json(runs[seed] / "eval_before.json")["success_rate"]
    return start != _json(first[seed] / "eval_before.json")["success_rate"]


def horizon_long() -> str:
    """The 32-hop table: per seed, final success [95% interval] (the seed's start)."""
    runs = _horizon_runs("long")
    seeds = sorted({s for by in runs.values() for s in by})
    first = runs["sao"]
    lines = [f"| row | {' | '.join(f'seed {s}' for s in seeds)} | mean ± sd (seeds) | "
             "wall (median) |", "|---" * (len(seeds) + 3) + "|"]
    for row, by in runs.items():
        cells, finals = [], []
        for s in seeds:
            if s not in by:
                cells.append("-")
                continue
            after, before = _json(by[s] / "eval_after.json"), _json(by[s] / "eval_before.json")
            finals.append(after["success_rate"])
            mark = "\\*" if _unpaired(by, first, s) else ""
            cells.append(f"{_cell(after['success_rate'], after['episodes'])} "
                         f"({before['success_rate']:.3f}){mark}")
        wall = statistics.median(_loop_minutes(_metrics(p)) for p in by.values())
        lines.append(f"| {HORIZON_ROWS[row]} | {' | '.join(cells)} | {_spread(finals)} "
                     f"({len(finals)}) | {wall:.1f} min |")
    return "\n".join(lines)


def horizon_short() -> str:
    """The 8-hop table: mean start, final mean ± sd, per seed with intervals, SAO's margin."""
    runs = _horizon_runs("short")
    first = runs["sao"]
    lines = ["| row | seeds | start | final, mean ± sd | per seed [95% interval] | SAO minus the "
             "row, per seed | wall (median) |", "|---|---|---|---|---|---|---|"]
    for row, by in runs.items():
        seeds = sorted(by)
        after = {s: _json(by[s] / "eval_after.json") for s in seeds}
        starts = [_json(by[s] / "eval_before.json")["success_rate"] for s in seeds]
        finals = [after[s]["success_rate"] for s in seeds]
        marks = {s: "\\*" if _unpaired(by, first, s) else "" for s in seeds}
        per_seed = ", ".join(f"{_cell(after[s]['success_rate'], after[s]['episodes'])}{marks[s]}"
                             for s in seeds)
        margin = ("" if row == "sao" else ", ".join(
            f"{_json(first[s] / 'eval_after.json')['success_rate'] - after[s]['success_rate']:+.3f}"
            f"{marks[s]}" for s in seeds if s in first))
        wall = statistics.median(_loop_minutes(_metrics(p)) for p in by.values())
        lines.append(f"| {HORIZON_ROWS[row]} | {len(seeds)} | {statistics.mean(starts):.3f} | "
                     f"{_spread(finals)} | {per_seed} | {margin} | {wall:.1f} min |")
    return "\n".join(lines)


def curriculum_warm_starts() -> str:
    """The curriculum's warm starts at 32 hops: steps per level, the last check, played success."""
    rows = []
    for run in sorted((DATA / "curriculum_keychain32").glob("seed*")):
        record = _json(run / "warm_start.json")
        stages = record["curriculum"]["stages"]
        before = _json(run / "eval_before.json")
        check = record["last_check"]
        rows.append(f"| {run.name[4:]} | {', '.join(str(s['steps']) for s in stages)} | "
                    f"{record['stopped_at_step']} of {record['max_steps']} | "
                    f"{'yes' if record['reached_target'] else 'no'} | {check['sampled']:.3f} / "
                    f"{check['greedy']:.3f} | "
                    f"{_cell(before['success_rate'], before['episodes'])} |")
    levels = ", ".join(str(x) for x in _json(next(
        (DATA / "curriculum_keychain32").glob("seed*/warm_start.json")))["curriculum"]["levels"])
    return "\n".join([f"| seed | supervised steps at hops {levels} | in all | target reached "
                      "| held-out check at 32 hops, sampled / greedy | played success at T = 1, "
                      "256 episodes [95%] |", "|---|---|---|---|---|---|", *rows])


def keychain_failures_32() -> str:
    """How the 32-hop curriculum runs' played episodes ended, before and after RL."""
    classes = ("solved", "wrong last key", "never submitted", "out of turns mid-chain",
               "submitted early")
    lines = ["| seed | evaluation | episodes | " + " | ".join(classes) + " |",
             "|---" * (len(classes) + 3) + "|"]
    for run in sorted((DATA / "curriculum_keychain32").glob("seed*")):
        for when, name in (("eval_before", "before RL"), ("eval_after", "after RL")):
            if not (run / f"{when}_episodes.json").exists():
                continue
            rows = _json(run / f"{when}_episodes.json")
            n = len(rows)
            share = {c: sum(r["how"] == c for r in rows) / n for c in classes}
            lines.append(f"| {run.name[4:]} | {name} | {n} | "
                         + " | ".join(f"{share[c]:.3f}" for c in classes) + " |")
    return "\n".join(lines)


def curriculum_rl_32() -> str:
    """SAO at 32 hops from the curriculum's warm starts: held-out success, the last steps."""
    lines = ["| seed | before RL [95%] | after 100 SAO steps [95%] | gain [95% interval] | "
             "training success, last 20 steps | truncated, last 20 steps | loop |",
             "|---|---|---|---|---|---|---|"]
    for run in sorted((DATA / "curriculum_keychain32").glob("seed*")):
        if not (run / "eval_after.json").exists():
            continue
        before, after = _json(run / "eval_before.json"), _json(run / "eval_after.json")
        lo, hi = gain_interval(before["success_rate"], before["episodes"],
                               after["success_rate"], after["episodes"])
        records = _metrics(run)
        last = records[-20:]
        success, truncated = (sum(r[k] for r in last) / len(last)
                              for k in ("rollout/success_rate", "rollout/truncated_rate"))
        lines.append(f"| {run.name[4:]} | {_cell(before['success_rate'], before['episodes'])} "
                     f"| {_cell(after['success_rate'], after['episodes'])} | "
                     f"{100 * (after['success_rate'] - before['success_rate']):+.1f} "
                     f"[{100 * lo:+.1f}, {100 * hi:+.1f}] | "
                     f"{success:.2f} | {truncated:.2f} "
                     f"| {_loop_minutes(records):.1f} min |")
    return "\n".join(lines)


def own_envs() -> str:
    """The generic recipe on the own envs (benchmarks/own_envs.py): warm start, gain, wall time."""
    lines = ["| env | seed | warm start: steps, target reached, last check (sampled / greedy) "
             "| before [95%] | after [95%] | gain [95% interval] | wall |",
             "|---|---|---|---|---|---|---|"]
    for kept in sorted((DATA / "own_envs" / "runs").glob("*/seed*")):
        if not (kept / "wall.json").exists():
            continue
        warm, check = _json(kept / "warm_start.json"), _json(kept / "warm_start.json")["last_check"]
        before, after = _json(kept / "eval_before.json"), _json(kept / "eval_after.json")
        lo, hi = gain_interval(before["success_rate"], before["episodes"],
                               after["success_rate"], after["episodes"])
        gain = after["success_rate"] - before["success_rate"]
        lines.append(
            f"| {kept.parent.name} | {kept.name[4:]} | {warm['stopped_at_step']} of "
            f"{warm['max_steps']}, {'yes' if warm['reached_target'] else 'no'}, "
            f"{check['sampled']:.3f} / {check['greedy']:.3f} | "
            f"{_cell(before['success_rate'], before['episodes'])} | "
            f"{_cell(after['success_rate'], after['episodes'])} | "
            f"{100 * gain:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}] | "
            f"{_json(kept / 'wall.json')['wall_s'] / 60:.1f} min |")
    return "\n".join(lines)


def _pct(summary: dict) -> str:
    lo, hi = wilson_interval(round(summary["success_rate"] * summary["episodes"]),
                             summary["episodes"])
    return f"{100 * summary['success_rate']:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}]"


def _vs_trl_seeds() -> list[dict]:
    return [_json(p) for p in sorted((DATA / "vs_trl_heldout").glob("seed*.json"))]


def vs_trl_keychain() -> str:
    """SAO against TRL's GRPOTrainer on KeyChain at 8 hops: held-out success, work done."""
    lines = ["| seed | before RL | SAO after | TRL after | SAO: trajectories / loop s | "
             "TRL: trajectories / loop s |", "|---|---|---|---|---|---|"]
    for d in _vs_trl_seeds():
        t = d["trl_train"]
        lines.append(f"| {d['seed']} | {_pct(d['before'])} | {_pct(d['sao'])} | "
                     f"{_pct(d['trl'])} | {d['sao_trajectories']:,} / {d['sao_wall_s']:,.0f} | "
                     f"{t['trajectories']:,} / {t['wall_s']:,.0f} |")
    return "\n".join(lines)


def vs_trl_keychain_kinds() -> str:
    """How the two sides' held-out episodes ended (the benchmark's ``episode_kinds``)."""
    kinds = (("solved", "solved"), ("wrong_answer", "wrong answer"),
             ("out_of_turns", "out of turns"), ("toolless_turn", "a turn without a tool call"))
    lines = ["| seed | side | " + " | ".join(name for _, name in kinds) + " |",
             "|---" * (len(kinds) + 2) + "|"]
    for d in _vs_trl_seeds():
        for side in ("sao", "trl"):
            counts = d["kinds"][side]
            lines.append(f"| {d['seed']} | {side.upper()} | "
                         + " | ".join(str(counts.get(k, 0)) for k, _ in kinds) + " |")
    return "\n".join(lines)


def _demo_runs(folder: str, after: str) -> str:
    """A ``benchmarks/demo.py`` summary (``summary.json`` in ``folder``): a row per seed."""
    lines = [f"| seed | after the warm start | {after} | gain | wall (whole job) |",
             "|---|---|---|---|---|"]
    for r in _json(DATA / folder / "summary.json")["runs"]:
        n = r["episodes"]
        lo, hi = r["gain_interval"]
        lines.append(f"| {r['seed']} | {_cell(r['start_success'], n)} | "
                     f"{_cell(r['final_success'], n)} | {100 * r['gain']:+.1f} "
                     f"[{100 * lo:+.1f}, {100 * hi:+.1f}] | {r['train_wall_s'] / 60:.1f} min |")
    return "\n".join(lines)


def harness_sdk_keychain() -> str:
    """The Agents SDK agent trained through the gateway (benchmarks/demo.py): per seed."""
    return _demo_runs("harness_sdk_keychain", "after 120 SAO steps")


def demo_seeds() -> str:
    """``make demo``'s job on seeds 0, 1, 2 (benchmarks/demo.py): per seed."""
    return _demo_runs("demo_seeds012", "after 200 SAO steps")


GENERATORS: dict[str, Callable[[], str]] = {
    "demo_seeds": demo_seeds,
    "curriculum_rl_32": curriculum_rl_32,
    "harness_sdk_keychain": harness_sdk_keychain,
    "vs_trl_keychain": vs_trl_keychain,
    "vs_trl_keychain_kinds": vs_trl_keychain_kinds,
    "own_envs": own_envs,
    "keychain_failures_32": keychain_failures_32,
    "curriculum_warm_starts": curriculum_warm_starts,
    "horizon_long": horizon_long,
    "horizon_short": horizon_short,
}
"""Each generated table's name (its marker) and generator."""


def regenerate(text: str) -> tuple[str, list[str]]:
    """``text`` with every generated block made anew; and the names of those that changed."""
    changed: list[str] = []

    def fill(m: re.Match) -> str:
        name = m[2]
        if name not in GENERATORS:
            raise KeyError(f"no generator for the table {name!r} (known: {sorted(GENERATORS)})")
        table = GENERATORS[name]().rstrip("\n") + "\n"
        if table != m[3]:
            changed.append(name)
        return m[1] + table + m[4]

    return BLOCK.sub(fill, text), changed


def blocks(text: str) -> list[str]:
    """The names of the generated blocks in ``text``."""
    return [m[2] for m in BLOCK.finditer(text)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true",
                   help="change nothing; exit 1 if a table differs from its data")
    args = p.parse_args(argv)
    stale = []
    for doc in DOCS:
        text = doc.read_text()
        new, changed = regenerate(text)
        stale += [f"{doc.relative_to(ROOT)}: {name}" for name in changed]
        if changed and not args.check:
            doc.write_text(new)
    for line in stale:
        print(("differs from its data: " if args.check else "rewritten: ") + line)
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
