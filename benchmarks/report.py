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
from collections import Counter
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


def own_envs(folder: str = "runs") -> str:
    """The generic recipe on the own envs (benchmarks/own_envs.py): warm start, gain, wall time.

    ``folder``: ``runs`` (today's recipe) or ``runs_tied`` (the recipe whose tiny model tied
    its LM head to its embeddings)."""
    lines = ["| env | seed | warm start: steps, target reached, last check (sampled / greedy) "
             "| before [95%] | after [95%] | gain [95% interval] | wall |",
             "|---|---|---|---|---|---|---|"]
    for kept in sorted((DATA / "own_envs" / folder).glob("*/seed*")):
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


def lora_vs_full() -> str:
    """The demo's job with LoRA rank 8 against full fine-tuning (both benchmarks/demo.py
    summaries: docs/data/demo_lora_r8 and docs/data/demo_seeds012), per seed."""
    full = {r["seed"]: r for r in _json(DATA / "demo_seeds012" / "summary.json")["runs"]}
    lora = {r["seed"]: r for r in _json(DATA / "demo_lora_r8" / "summary.json")["runs"]}
    lines = ["| seed | start (full / LoRA) | full fine-tuning: gain [95%] | LoRA r8: gain [95%] "
             "| LoRA - full | wall, full / LoRA |", "|---|---|---|---|---|---|"]
    diffs = []
    for seed in sorted(full.keys() & lora.keys()):
        f, r = full[seed], lora[seed]
        diffs.append(100 * (r["gain"] - f["gain"]))
        cells = [f"{100 * x['gain']:+.1f} [{100 * x['gain_interval'][0]:+.1f}, "
                 f"{100 * x['gain_interval'][1]:+.1f}]" for x in (f, r)]
        lines.append(f"| {seed} | {f['start_success']:.3f} / {r['start_success']:.3f} | "
                     f"{cells[0]} | {cells[1]} | {diffs[-1]:+.1f} | "
                     f"{f['train_wall_s'] / 60:.1f} / {r['train_wall_s'] / 60:.1f} min |")
    lines.append(f"| mean ± sd | | | | {statistics.mean(diffs):+.1f} ± "
                 f"{statistics.stdev(diffs) if len(diffs) > 1 else 0.0:.1f} | |")
    return "\n".join(lines)


def harness_sdk_keychain() -> str:
    """The Agents SDK agent trained through the gateway (benchmarks/demo.py): per seed."""
    return _demo_runs("harness_sdk_keychain", "after 120 SAO steps")


def demo_seeds() -> str:
    """``make demo``'s job on seeds 0, 1, 2 (benchmarks/demo.py): per seed."""
    return _demo_runs("demo_seeds012", "after 200 SAO steps")


# Tables of docs/benchmarks.md from the benchmark scripts' --json files (benchmarks/_record.py).


def _runs_cell(median: float, runs: list[float]) -> str:
    """``3.10 (3.10, 3.05, 3.13)``: a median and the runs it is the median of."""
    return f"{median:.2f} ({', '.join(f'{x:.2f}' for x in runs)})"


def _ms(x: float) -> str:
    return f"{x:.1f} ms" if x < 10 else f"{x:.0f} ms"


def _lr(lr: float) -> str:
    return f"{lr:.0e}".replace("e-0", "e-")


def hf_backend_batching() -> str:
    """HFBackend: N concurrent requests against the same one at a time (hf_backend.py)."""
    d = _json(DATA / "hf_backend_batching.json")
    reps = d["repeats"]
    lines = [f"| repeat | batched ({d['settings']['requests']} concurrent) tok/s | sequential "
             "(1 at a time) tok/s | ratio |", "|---|---|---|---|"]
    lines += [f"| {i} | {r['batched_tok_s']:.0f} | {r['sequential_tok_s']:.0f} | "
              f"{r['batched_tok_s'] / r['sequential_tok_s']:.2f} |" for i, r in enumerate(reps)]
    b, s = (statistics.median(r[k] for r in reps) for k in ("batched_tok_s", "sequential_tok_s"))
    lines.append(f"| **median** | **{b:.0f}** | **{s:.0f}** | **{b / s:.2f}x** (ratio of "
                 "medians) |")
    return "\n".join(lines)


def kv_reuse() -> str:
    """Long KeyChain episodes with and without KV reuse across turns (kv_reuse.py)."""
    d = _json(DATA / "kv_reuse_smollm2.json")
    lines = ["| episode | with reuse | without (`session_cache_bytes=0`) | speed-up |",
             "|---|---|---|---|"]
    for i, (a, b) in enumerate(zip(d["reuse"]["episodes"], d["none"]["episodes"], strict=True)):
        lines.append(f"| {i} | {a['wall_s']:.1f} s, {a['prefill_per_turn']:,.0f} prefilled per "
                     f"turn ({a['reused_per_turn']:,.0f} reused) | {b['wall_s']:.1f} s, "
                     f"{b['prefill_per_turn']:,.0f} per turn | {b['wall_s'] / a['wall_s']:.2f}x |")
    a, b = (statistics.median(e["wall_s"] for e in d[k]["episodes"]) for k in ("reuse", "none"))
    lines.append(f"| median | {a:.1f} s | {b:.1f} s | **{b / a:.2f}x** |")
    return "\n".join(lines)


SERVERS = ("sao", "vllm")
"""The server kinds of benchmarks/inference.py: `sao-gym serve` and vLLM."""


def inference_decode() -> str:
    """Decode tokens/s of HFBackend and both servers, per model and concurrency (inference.py)."""
    d = _json(DATA / "inference.json")
    lines = ["| model | concurrent | HFBackend in-process | `sao-gym serve` | vLLM-CPU server |",
             "|---|---|---|---|---|"]
    for name, m in d["models"].items():
        for c in d["concurrency"]:
            cells = [m["hf"][str(c)]["hf"] if "hf" in m else None,
                     *(m[k][str(c)]["backend"] if k in m else None for k in SERVERS)]
            lines.append(f"| {name} ({m['params'] / 1e6:.1f}M) | {c} | "
                         + " | ".join("-" if x is None else f"{x:,.0f}" for x in cells) + " |")
    return "\n".join(lines)


def inference_weight_sync() -> str:
    """Weight sync of the model's own state dict, median of the repeats (inference.py)."""
    d = _json(DATA / "inference.json")
    lines = ["| model (fp32 size) | HFBackend in-process | `sao-gym serve` (publish part) | "
             "vLLM-CPU (publish part) |", "|---|---|---|---|"]
    for name, m in d["models"].items():
        cells = [f"{1e3 * m['hf']['update_s']:,.0f} ms" if "hf" in m else "-",
                 *(f"{1e3 * m[k]['update_s']:,.0f} ms ({1e3 * m[k]['publish_s']:,.0f} ms)"
                   if k in m else "-" for k in SERVERS)]
        lines.append(f"| {name} ({m['fp32_mb']:,.0f} MB) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


LEARNER_ROWS = {
    "bare": "bare fwd+bwd",
    "grpo": "`grpo` (PPO clip)",
    "grpo_dis": "`grpo_dis`",
    "sao": "`sao` (K = 2 updates of the full-size critic + policy)",
    "sao K=1": "`sao`, K = 1",
    "sao 2L critic": "`sao`, 2-layer critic (`critic_layers: 2`, K = 2)",
    "sao 1L critic": "`sao`, 1-layer critic (`critic_layers: 1`, K = 2)",
}


def learner_sao_vs_grpo() -> str:
    """One learner step of each algorithm on one batch, at 2 torch threads and at 1 (learner.py)."""
    two, one = (_json(DATA / "learner_sao_vs_grpo" / f"threads{n}.json") for n in (2, 1))
    m2, m1 = ({k: statistics.median(v) for k, v in d["times_s"].items()} for d in (two, one))
    lines = ["| step | 2 threads: median | tokens/s | x `grpo` | x `grpo_dis` | 1 thread: median "
             "| x `grpo` |", "|---|---|---|---|---|---|---|"]
    for name, t in m2.items():
        alone = f"{m1[name]:.3f} s | {m1[name] / m1['grpo']:.2f}" if name in m1 else "- | -"
        lines.append(f"| {LEARNER_ROWS.get(name, f'`{name}`')} | {t:.3f} s | "
                     f"{two['tokens'] / t:.0f} | {t / m2['grpo']:.2f} | "
                     f"{t / m2['grpo_dis']:.2f} | {alone} |")
    return "\n".join(lines)


SANDBOX_CASES = ("floor: spawn true", "local true", "local python", "local start+close")


def sandbox_local() -> str:
    """LocalSandbox latencies: each run's medians, and their median (sandbox.py, one file a run)."""
    runs = {p.stem[3:]: _json(p)["summary"] for p in sorted((DATA / "sandbox").glob("run*.json"))}

    def cells(ms: list[float]) -> str:
        return " | ".join(f"{x:.1f} ms" if case == "local start+close" else f"{x:.2f} ms"
                          for case, x in zip(SANDBOX_CASES, ms, strict=True))

    lines = ["| run | floor | local `true` | local python one-liner | start+close |",
             "|---|---|---|---|---|"]
    lines += [f"| {run} | {cells([r[c]['median_ms'] for c in SANDBOX_CASES])} |"
              for run, r in runs.items()]
    medians = [statistics.median(r[c]["median_ms"] for r in runs.values()) for c in SANDBOX_CASES]
    lines.append(f"| median | {cells(medians)} |")
    return "\n".join(lines)


DOCKER_KEYS = ("warm exec", "cold start", "file round trip", "close")


def docker_sandbox() -> str:
    """DockerSandbox: warm exec, cold start, file round trip and close per repeat."""
    d = _json(DATA / "docker_sandbox.json")

    def cells(row: dict[str, float]) -> str:
        return " | ".join(f"{1e3 * row[k]:.1f} ms" if k == "warm exec" else f"{1e3 * row[k]:.0f} ms"
                          for k in DOCKER_KEYS)

    lines = [f"| repeat | warm exec (median of {d['execs']}) | cold start | file round trip | "
             "close |", "|---|---|---|---|---|"]
    lines += [f"| {i} | {cells(row)} |" for i, row in enumerate(d["rows_s"])]
    median = {k: statistics.median(row[k] for row in d["rows_s"]) for k in DOCKER_KEYS}
    lines.append(f"| median | {cells(median)} |")
    return "\n".join(lines)


def docker_exec_stress() -> str:
    """Short commands under GC pressure, before the fix and after (docker_exec_stress.py)."""
    lines = ["| code | wrong commands (per trial) | total | what the wrong ones got |",
             "|---|---|---|---|"]
    for code in ("before", "after"):
        path = DATA / "docker_exec_stress" / f"{code}.json"
        if not path.exists():
            continue
        d = _json(path)
        got = Counter(w for t in d["trials"] for w in t["wrong"])
        what = "; ".join(f"{n} x {w}".replace("|", "\\|") for w, n in got.most_common()) or "-"
        lines.append(f"| {code} ({d['provenance']['commit']}) | "
                     f"{', '.join(str(n) for n in d['per_trial'])} | "
                     f"**{d['wrong']} of {d['commands']}** | {what} |")
    return "\n".join(lines)


def async_vs_sync() -> str:
    """Trajectories/s of async and sync mode on HeavyTail (async_vs_sync.py)."""
    d = _json(DATA / "async_vs_sync.json")
    lines = [f"| mode | trajectories/s (median of {len(d['runs']['async'])}) | runs |",
             "|---|---|---|"]
    lines += [f"| {mode} | {d[f'{mode}_trajectories_per_s']:.2f} | "
              f"{', '.join(f'{x:.2f}' for x in d['runs'][mode])} |" for mode in ("async", "sync")]
    lines.append(f"| **ratio** | **{d['ratio']:.2f}x** | |")
    return "\n".join(lines)


def sync_reproducible() -> str:
    """Two sync runs of one seed and a batched one, per config (sync_reproducible.py)."""
    lines = ["| config (seed) | tensors differing, run a vs b | metrics a == b | differing, a vs "
             "batched | steps/s invariant (a, b) | steps/s batched | batched / invariant |",
             "|---|---|---|---|---|---|---|"]
    for path in sorted((DATA / "sync_reproducible").glob("*.json")):
        d = _json(path)
        sets = dict(kv.split("=", 1) for kv in d["config"])
        label = f"{sets.get('env', 'demo recipe')} ({sets['seed']})"
        for r in d["rounds"]:
            speed = r["steps_per_s"]
            lines.append(f"| {label} | {r['differ_a_b']} of {r['tensors']} | "
                         f"{'yes' if r['metrics_equal_a_b'] else 'no'} | "
                         f"{r['differ_a_batched']} of {r['tensors']} | {speed['a']:.3g}, "
                         f"{speed['b']:.3g} | {speed['batched']:.3g} | "
                         f"{r['batched_over_invariant']:.2f}x |")
    return "\n".join(lines)


def staleness_bound() -> str:
    """``async/staleness_max`` against the bound K, 32 episodes at once (staleness_bound.py)."""
    lines = ["| K | lines | `staleness_max` over the run | lines at the bound | lines over it | "
             "mean `staleness_mean` | loop time |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['bound']} | {r['lines']} | {r['staleness_max']:.0f} | "
              f"{r['lines_at_bound']} | {r['lines_over_bound']} | {r['staleness_mean']:.2f} | "
              f"{r['loop_s']:.0f} s |" for r in _json(DATA / "staleness_bound.json")["runs"]]
    return "\n".join(lines)


def soak() -> str:
    """RSS and non-finite metrics over a long async run (soak.py)."""
    d = _json(DATA / "soak.json")
    return "\n".join([
        f"| | RSS at step 100 | peak after step 100 | at step {d['steps']} | growth after step "
        "100 | non-finite values | loop time |", "|---|---|---|---|---|---|---|",
        f"| trainer | {d['rss_mb_step_100']:.1f} MB | {d['rss_mb_max_after_100']:.1f} MB | "
        f"{d['rss_mb_end']:.1f} MB | {100 * d['rss_growth_after_100']:+.1f}% | "
        f"{d['nonfinite_values']} | {d['loop_seconds'] / 60:.1f} min |"])


def envs_latency() -> str:
    """Each environment's own latency under a wave of scripted episodes (envs.py)."""
    d = _json(DATA / "envs_local.json")
    first = next(iter(d["envs"].values()))
    lines = [f"| environment | episodes/s ({first['concurrency']} at once) | step median | "
             "step p95 | reset median | per tool, median | solved |",
             "|---|---|---|---|---|---|---|"]
    for name, r in d["envs"].items():
        rate = r["episodes_per_s"]
        rate = f"{rate:.0f}" if rate >= 100 else f"{rate:.1f}" if rate >= 10 else f"{rate:.2f}"
        tools = ", ".join(f"{k} {_ms(v['median_ms'])}" for k, v in r.items()
                          if isinstance(v, dict) and "median_ms" in v and k not in
                          ("reset", "step"))
        lines.append(f"| {name} | {rate} | {_ms(r['step']['median_ms'])} | "
                     f"{_ms(r['step']['p95_ms'])} | {_ms(r['reset']['median_ms'])} | {tools} | "
                     f"{round(r['solved_rate'] * r['episodes'])}/{r['episodes']} |")
    return "\n".join(lines)


def _ray_table(names: list[str]) -> str:
    """Ray's trajectories/s at 1, 2, 4 workers and one process, a column pair per file."""
    ds = [_json(DATA / "ray_scaling" / f"{name}.json") for name in names]
    epw = ds[0]["episodes_per_worker"]
    rows = [(f"ray_{n}", f"Ray, {n} worker{'s' * (n > 1)} ({n * epw} episodes)")
            for n in ds[0]["settings"]["workers"]]
    rows.append(("local_equal_to_ray_2", f"one process, {2 * epw} episodes"))
    head = " | ".join(f"seed {d['settings']['seed']}: trajectories/s (runs) | vs 1 worker"
                      for d in ds)
    lines = [f"| run | {head} |", "|---" * (1 + 2 * len(ds)) + "|"]
    for key, label in rows:
        cells = []
        for d in ds:
            med = d["trajectories_per_s"][key]
            one = d["trajectories_per_s"]["ray_1"]
            cells += [_runs_cell(med, d["runs"][key]),
                      f"{med / one:.2f}x" if key.startswith("ray_") else ""]
        lines.append(f"| {label} | {' | '.join(cells)} |")
    overhead = [c for d in ds for c in (f"**{100 * d['ray_overhead_vs_local']:.1f}%**", "")]
    lines.append(f"| **Ray overhead at {2 * epw} episodes** | {' | '.join(overhead)} |")
    return "\n".join(lines)


def ray_scaling() -> str:
    """Ray rollout workers on HeavyTail, seeds 0 and 1 (ray_scaling.py)."""
    return _ray_table(["seed0", "seed1"])


def ray_scaling_light() -> str:
    """Ray rollout workers where the env's latency dominates less (ray_scaling.py)."""
    return _ray_table(["light"])


def ray_learner_threads() -> str:
    """The Ray learner's torch threads: Ray's rule against one per core (ray_scaling.py)."""
    lines = ["| learner threads | 1 worker | 2 workers | 4 workers (runs) | one process, 2 "
             "workers' episodes | 1 -> 2 | overhead |", "|---|---|---|---|---|---|---|"]
    for path in sorted((DATA / "ray_scaling").glob("learner_threads*.json")):
        d = _json(path)
        t = d["trajectories_per_s"]
        lines.append(f"| {d['settings']['learner_threads'] or 'default'} | {t['ray_1']:.2f} | "
                     f"{t['ray_2']:.2f} | {_runs_cell(t['ray_4'], d['runs']['ray_4'])} | "
                     f"{t['local_equal_to_ray_2']:.2f} | {d['speedup_1_to_2']:.2f}x | "
                     f"{100 * d['ray_overhead_vs_local']:.1f}% |")
    return "\n".join(lines)


VIEWER_ROWS = {
    "api_first_page_cold_s": "API: first page, first request to a fresh server (reads the index)",
    "api_first_page_warm_s": "API: the same page again",
    "api_long_episode_s": "API: the {long:,}-token record",
    "in_page_first_page_s": "Chromium, page's own clock: the list's first page drawn, from "
                            "navigation (fresh server)",
    "in_page_long_episode_s": "Chromium, page's own clock: the {long:,}-token episode page drawn",
    "browser_first_page_s": "Chromium as WebDriver sees it (its polling included): the list",
    "browser_long_episode_s": "Chromium as WebDriver sees it (its polling included): the episode",
}


def viewer_scale() -> str:
    """`sao-gym view` on a run of many kept rollouts: medians [min, max] (viewer_scale.py)."""
    d = _json(DATA / "viewer_scale.json")
    s = d["settings"]
    lines = [f"| what ({s['rollouts']:,} rollouts) | median of {s['repeats']} [min, max] |",
             "|---|---|"]
    for key, label in VIEWER_ROWS.items():
        if key in d["times_s"]:
            xs = d["times_s"][key]
            lines.append(f"| {label.format(long=s['long_tokens'])} | "
                         f"{statistics.median(xs):.3f} s [{min(xs):.3f}, {max(xs):.3f}] |")
    return "\n".join(lines)


def vs_trl_tools() -> str:
    """TRL against SAO on the slow-tool Arithmetic env: medians over runs (vs_trl_tools.py)."""
    d = _json(DATA / "vs_trl_tools" / "results.json")
    trl, sao = d["trl"], d["sao"]
    rows = [("trajectories", "trajectories", "{:.0f}"), ("learner steps", "steps", "{:.0f}"),
            ("training wall time (s)", "wall_s", "{:.1f}"),
            ("**trajectories/s**", "trajectories_per_s", "**{:.2f}**"),
            ("generated tokens/s", "tokens_per_s", "{:.0f}"),
            ("tool calls / trajectory", "tool_calls_per_trajectory", "{:.2f}"),
            ("mean reward", "mean_reward", "{:.3f}"), ("peak RSS (MB)", "peak_rss_mb", "{:.0f}")]
    n = len(d["runs"]["trl"])
    lines = [f"| (median of {n} run{'s' * (n > 1)}) | TRL GRPOTrainer | sao-gym train (SAO) |",
             "|---|---|---|"]
    lines += [f"| {label} | {fmt.format(trl[k])} | {fmt.format(sao[k])} |"
              for label, k, fmt in rows]
    per_run = [", ".join(f"{r['trajectories_per_s']:.2f}" for r in d["runs"][side])
               for side in ("trl", "sao")]
    lines += [f"| trajectories/s of each run | {per_run[0]} | {per_run[1]} |",
              f"| time inside tool calls (s) | {trl['tools_s']:.1f} (sequential, "
              f"{100 * trl['tools_s'] / trl['wall_s']:.0f}% of wall) | {sao['tool_delay_s']:.1f} "
              "summed over all episodes (concurrent) |",
              f"| time inside generate / learner updates (s) | generate {trl['generate_s']:.1f} "
              f"({100 * trl['generate_s'] / trl['wall_s']:.0f}%), the rest "
              f"{trl['wall_s'] - trl['tools_s'] - trl['generate_s']:.1f} | learner updates "
              f"{sao['update_s']:.1f} ({100 * sao['update_s'] / sao['wall_s']:.0f}%; sampling "
              "runs alongside) |",
              f"| SAO / TRL trajectories/s | | **{d['ratio']:.2f}x** |"]
    return "\n".join(lines)


def _vs_trl_wd() -> list[dict]:
    """The weight-decay start's reports (vs_trl.py's results*.json), by final seed."""
    return sorted((_json(p) for p in (DATA / "vs_trl_wd").glob("results*.json")),
                  key=lambda d: d["settings"]["final_seed"])


def vs_trl_sweep() -> str:
    """The learning-rate sweep of each side: steps, completions/s, held-out accuracy after."""
    sweep = _vs_trl_wd()[0]["sweep"]
    by = {(r["side"], r["lr"]): r for r in sweep}
    lines = ["| lr | TRL: steps, completions/s, accuracy | SAO: steps, completions/s, accuracy |",
             "|---|---|---|"]
    for lr in sorted({r["lr"] for r in sweep}):
        cells = [f"{r['steps']}, {r['completions_per_s']:.2f}, {100 * r['accuracy_after']:.1f}%"
                 if (r := by.get((side, lr))) else "-" for side in ("trl", "sao")]
        lines.append(f"| {_lr(lr)} | {' | '.join(cells)} |")
    return "\n".join(lines)


def _reward(run: dict) -> str:
    first, last = run["train_rewards_first_last"]
    return f"{first:.2f} -> {last:.2f}"


def _accuracy(run: dict) -> str:
    return (f"{100 * run['accuracy_before']:.1f}% -> {100 * run['accuracy_after']:.1f}% "
            f"(**{run['gain_points']:+.1f}**)")


def vs_trl_finals() -> str:
    """The final runs of both sides, per trainer seed (vs_trl.py, one report per --final-seed)."""
    runs = _vs_trl_wd()
    lines = [f"| | TRL GRPOTrainer (lr {_lr(runs[0]['trl']['lr'])}) | sao-gym train, SAO (lr "
             f"{_lr(runs[0]['sao']['lr'])}) |", "|---|---|---|"]
    for d in runs:
        trl, sao = d["trl"], d["sao"]
        ratio = sao["completions_per_s"] / trl["completions_per_s"]
        rows = [("learner steps", str(trl["steps"]), str(sao["steps"])),
                ("completions/s", f"{trl['completions_per_s']:.2f}",
                 f"{sao['completions_per_s']:.2f} (**{ratio:.2f}x**)"),
                ("generated tokens/s", f"{trl['tokens_per_s']:.1f}", f"{sao['tokens_per_s']:.1f}"),
                ("peak RSS of the training process", f"{trl['peak_rss_mb']:,.0f} MB",
                 f"{sao['peak_rss_mb']:,.0f} MB"),
                ("training reward, first -> last 5 logged steps", _reward(trl), _reward(sao)),
                ("greedy held-out accuracy", _accuracy(trl), _accuracy(sao))]
        seed = d["settings"]["final_seed"]
        lines += [f"| {label} (seed {seed}) | {a} | {b} |" for label, a, b in rows]
    return "\n".join(lines)


def vs_trl_single_turn() -> str:
    """TRL's single-turn task from the plain-SFT warm start (docs/data/vs_trl_plain/): a row
    per trainer run, SAO with its full-size critic and with a 1-layer one."""
    lines = ["| trainer | lr | learner steps in 10 min | completions/s | greedy held-out accuracy, "
             "200 problems [95%] | gain (points) |", "|---|---|---|---|---|---|"]
    full = _json(DATA / "vs_trl_plain" / "results.json")
    one = _json(DATA / "vs_trl_plain" / "results-critic1L.json")
    for name, run in (("TRL GRPOTrainer", full["trl"]), ("SAO, full-size critic", full["sao"]),
                      ("SAO, 1-layer critic", one["sao"])):
        ratio = run["completions_per_s"] / full["trl"]["completions_per_s"]
        lines.append(f"| {name} | {_lr(run['lr'])} | {run['steps']} | "
                     f"{run['completions_per_s']:.1f} ({ratio:.2f}x) | "
                     f"{run['accuracy_before']:.3f} -> {_cell(run['accuracy_after'], 200)} "
                     f"| {run['gain_points']:+.1f} |")
    return "\n".join(lines)


def vs_trl_keychain_wall() -> str:
    """Trajectories per second of both sides' training loops on KeyChain (vs_trl_heldout.py)."""
    lines = ["| seed | SAO | TRL | TRL / SAO | TRL tool calls an episode |",
             "|---|---|---|---|---|"]
    for d in _vs_trl_seeds():
        t = d["trl_train"]
        sao, trl = d["sao_trajectories"] / d["sao_wall_s"], t["trajectories"] / t["wall_s"]
        lines.append(f"| {d['seed']} | {d['sao_trajectories']:,} in {d['sao_wall_s']:,.0f} s: "
                     f"{sao:.2f} | {t['trajectories']:,} in {t['wall_s']:,.0f} s: {trl:.2f} | "
                     f"{trl / sao:.2f}x | {t['tool_calls_per_episode']:.2f} |")
    return "\n".join(lines)


GENERATORS: dict[str, Callable[[], str]] = {
    "demo_seeds": demo_seeds,
    "curriculum_rl_32": curriculum_rl_32,
    "harness_sdk_keychain": harness_sdk_keychain,
    "vs_trl_keychain": vs_trl_keychain,
    "vs_trl_keychain_kinds": vs_trl_keychain_kinds,
    "own_envs": own_envs,
    "own_envs_tied": lambda: own_envs("runs_tied"),
    "keychain_failures_32": keychain_failures_32,
    "curriculum_warm_starts": curriculum_warm_starts,
    "horizon_long": horizon_long,
    "horizon_short": horizon_short,
    "vs_trl_keychain_wall": vs_trl_keychain_wall,
    "vs_trl_single_turn": vs_trl_single_turn,
    "lora_vs_full": lora_vs_full,
    "hf_backend_batching": hf_backend_batching,
    "kv_reuse": kv_reuse,
    "inference_decode": inference_decode,
    "inference_weight_sync": inference_weight_sync,
    "learner_sao_vs_grpo": learner_sao_vs_grpo,
    "vs_trl_sweep": vs_trl_sweep,
    "vs_trl_finals": vs_trl_finals,
    "sandbox_local": sandbox_local,
    "docker_sandbox": docker_sandbox,
    "docker_exec_stress": docker_exec_stress,
    "async_vs_sync": async_vs_sync,
    "sync_reproducible": sync_reproducible,
    "staleness_bound": staleness_bound,
    "soak": soak,
    "envs_latency": envs_latency,
    "vs_trl_tools": vs_trl_tools,
    "ray_scaling": ray_scaling,
    "ray_scaling_light": ray_scaling_light,
    "ray_learner_threads": ray_learner_threads,
    "viewer_scale": viewer_scale,
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
