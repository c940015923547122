"""TRL's GRPOTrainer against SAO on held-out success: the same warm start, the same wall clock.

On ``sao_gym/KeyChain-v0`` at ``--hops`` (default 8: the horizon study's short
horizon, ``horizon_study.recipe``), per seed:

1. **Warm start** (``OUT/warm/seedN``): the generic CPU recipe's supervised warm
   start, with ``chat_template: chatml``: tool calls as ``<tool_call>`` JSON
   blocks, which TRL reads back with the tokenizer's ``response_template``
   (the recipe's default ``compact`` template has the model write
   ``lookup(4817)``, a syntax our agent parses and TRL does not).
2. **SAO** (``OUT/runs/sao/seedN``): ``sao-gym train`` from that checkpoint,
   ``--steps`` steps of the recipe (``learning_study.train``), evaluated on the
   held-out seeds at the end.
3. **TRL** (``OUT/runs/trl/seedN``): ``GRPOTrainer`` through our TRL adapter
   (:func:`sao_gym.adapters.trl.environment`) from the same checkpoint, for as
   long as the SAO run's training loop took (its last ``time/elapsed_s``,
   summed over resumed segments), then ``sao-gym eval`` with the SAO run's
   held-out seeds, episodes, temperature, turn and context budgets.

Every run is a process of its own with one torch thread, two at a time
(``--parallel``)::

    .venv/bin/python benchmarks/vs_trl_heldout.py --out runs/vs-trl-keychain

TRL settings: ``num_generations`` ``--generations`` (G) of the same prompt,
``per_device_train_batch_size`` the recipe's batch (16: 16/G prompts a step),
``beta=0``, temperature 1, constant learning rate ``--lr`` (default: the
recipe's, SAO's), gradient clipping 1.0, ``max_completion_length`` the env's
whole turn budget (turns x (the fitted ``max_new_tokens`` + ``--obs-tokens``)),
``max_tool_calling_iterations`` the env's turn budget. TRL ends an episode when
the model stops calling tools: after ``submit`` the model may still call one,
which the adapter answers with an error; the reward is unchanged.

Report (``OUT/table.md``, ``OUT/results.json``): per seed, held-out success
before (the warm start's evaluation), after SAO and after TRL, each with its
95% interval; the trajectories each side trained on in that wall time; and
how each trained policy's held-out episodes ended (:func:`episode_kinds`, read
from the very episodes of its evaluation).
``--smoke``: every part on numbers too small to mean anything.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml
from _runs import child_env, loop_seconds, peak_rss_mb, read_json, run_logged, say, write_json

OBS_TOKENS = 48
"""Room per turn for the env's answer in TRL's completion budget (a KeyChain answer
is ~28 tokens of the study's tokenizer)."""


def sao_wall_s(run: Path) -> float:
    """The SAO run's training-loop seconds, summed over resumed segments."""
    from sao_gym.logging import read_metrics

    return loop_seconds(read_metrics(run))


def episode_turns(env_id: str, env_kwargs: dict[str, Any]) -> int:
    """The turns an episode may take: the env's own budget (``turn_budget`` after a
    reset, as KeyChain has) or its registered turn limit, whichever is smaller."""
    import sao_gym

    env = sao_gym.make(env_id, **env_kwargs)
    try:
        env.reset(seed=0)
        limits = [getattr(env.unwrapped, "turn_budget", None), env.spec.max_episode_steps]
        known = [int(x) for x in limits if x]
        if not known:
            raise SystemExit(f"{env_id} has no turn limit to size TRL's completions by")
        return min(known)
    finally:
        env.close()


def eval_command(policy: Path, config: dict[str, Any], out: Path) -> list[str]:
    """``sao-gym eval`` of ``policy`` with the SAO run's held-out seeds and budgets."""
    from learning_study import SAO_GYM

    return [SAO_GYM, "eval", "--model", str(policy), "--env", config["env"],
            "--env-kwargs", json.dumps(config["env_kwargs"]),
            "--episodes", str(config["eval"]["episodes"]),
            "--max-new-tokens", str(config["rollout"]["max_new_tokens"]),
            "--temperature", str(config["eval"].get("temperature")
                                 or config["rollout"]["temperature"]),
            "--max-context-tokens", str(config["rollout"]["max_context_tokens"]),
            "--set", f"rollout.tool_schemas={config['rollout'].get('tool_schemas', 'env')}",
            "--out", str(out)]


def episode_kinds(trajectories: Path) -> dict[str, int]:
    """How the ATIF episodes in ``trajectories`` ended: ``solved`` (reward > 0), else
    ``toolless_turn`` (some turn called no tool), ``out_of_turns`` (truncated), or
    ``wrong_answer`` (the env ended it unrewarded)."""
    kinds = dict.fromkeys(("solved", "toolless_turn", "out_of_turns", "wrong_answer"), 0)
    for path in sorted(trajectories.glob("*.json")):
        episode = json.loads(path.read_text())
        extra = episode["extra"]
        turns = [s for s in episode["steps"] if s["source"] == "agent"]
        if extra["reward"] > 0:
            kind = "solved"
        elif any(not s.get("tool_calls") for s in turns):
            kind = "toolless_turn"
        elif extra["truncated"]:
            kind = "out_of_turns"
        else:
            kind = "wrong_answer"
        kinds[kind] += 1
    return kinds


def kept_eval_trajectories(run: Path) -> None:
    """The SAO run's own final evaluation (its kept ``eval_after`` rollouts) as ATIF
    in ``run/heldout_trajectories``, where :func:`policy_episode_kinds` reads it; nothing
    when the run kept none."""
    from sao_gym.adapters.atif import trajectory, write_trajectories
    from sao_gym.rollout_store import RolloutReader

    reader = RolloutReader(run)
    if "eval_after" in reader.splits():
        shutil.rmtree(run / "heldout_trajectories", ignore_errors=True)
        write_trajectories(map(trajectory, reader.records("eval_after")),
                           run / "heldout_trajectories")


def policy_episode_kinds(policy: Path, config: dict[str, Any], run_dir: Path) -> dict[str, int]:
    """:func:`episode_kinds` of ``policy``'s held-out episodes, kept in
    ``run_dir/heldout_kinds.json``: from the trajectories the run's own evaluation wrote
    to ``run_dir/heldout_trajectories`` when it has all of them, else from one more
    evaluation with the same settings."""
    kept = run_dir / "heldout_kinds.json"
    if kept.exists():
        return read_json(kept)
    out = run_dir / "heldout_trajectories"
    if len(list(out.glob("*.json"))) != config["eval"]["episodes"]:
        shutil.rmtree(out, ignore_errors=True)
        cmd = eval_command(policy, config, run_dir / "heldout_kinds_eval.json")
        with (run_dir / "eval.log").open("a") as f:
            subprocess.run([*cmd, "--trajectories", str(out)], stdout=f,
                           stderr=subprocess.STDOUT, check=True, env=child_env(1))
    found = len(list(out.glob("*.json")))
    if found != config["eval"]["episodes"]:
        raise RuntimeError(f"{out} holds {found} episodes, not the {config['eval']['episodes']} "
                           f"evaluated: see {run_dir / 'eval.log'}")
    kinds = episode_kinds(out)
    write_json(kept, kinds)
    return kinds


# ---------- one TRL run (a worker process: this file with --trl-worker SPEC) ----------


def trl_worker(spec_path: Path) -> None:
    """GRPOTrainer from the spec's warm checkpoint for ``wall_s`` seconds; save the policy."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from sao_gym.adapters.trl import environment

    spec = read_json(spec_path)
    run_dir = Path(spec["run_dir"])

    class WallClock(TrainerCallback):
        """Stops training once ``wall_s`` seconds of the loop are spent."""

        start = end = 0.0

        def on_train_begin(self, args, state, control, **kwargs):
            self.start = time.monotonic()

        def on_step_end(self, args, state, control, **kwargs):
            spent = time.monotonic() - self.start
            say(f"trl step {state.global_step}: {spent:.0f} of {spec['wall_s']:.0f} s")
            if spent >= spec["wall_s"]:
                control.should_training_stop = True

        def on_train_end(self, args, state, control, **kwargs):
            self.end = time.monotonic()

    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    # training prompts: seeds of their own, far from the held-out ones
    first = 2_000_000 + 100_000 * spec["seed"]
    env = environment(spec["env"], seeds=range(first, first + 100_000), **spec["env_kwargs"])
    config = GRPOConfig(
        output_dir=str(run_dir / "trl_out"), learning_rate=spec["lr"],
        lr_scheduler_type="constant", warmup_steps=0, max_steps=1_000_000,
        per_device_train_batch_size=spec["batch"], gradient_accumulation_steps=1,
        num_generations=spec["generations"], max_completion_length=spec["completion_tokens"],
        max_tool_calling_iterations=spec["max_turns"],
        temperature=1.0, top_p=1.0, top_k=0, beta=0.0, max_grad_norm=1.0,
        activation_checkpointing=False, use_cpu=True, bf16=False, fp16=False,
        report_to="none", logging_steps=1, save_strategy="no", disable_tqdm=True,
        dataloader_num_workers=0, seed=spec["seed"])
    clock = WallClock()
    trainer = GRPOTrainer(model=model, args=config, train_dataset=env.train_dataset,
                          processing_class=tokenizer, reward_funcs=env.reward_funcs,
                          environment_factory=env.environment_factory, callbacks=[clock])
    trainer.train()
    history = [h for h in trainer.state.log_history if "rewards/env_reward/mean" in h]
    for pool in trainer._environment_pool.values():
        for instance in pool:
            instance._session.close()
    policy = run_dir / "policy"
    trainer.model.save_pretrained(policy)
    tokenizer.save_pretrained(policy)
    write_json(run_dir / "train.json", {
        "steps": trainer.state.global_step,
        "trajectories": trainer.state.global_step * spec["batch"],
        "wall_s": round(clock.end - clock.start, 1),
        "reward_first5": statistics.mean(h["rewards/env_reward/mean"] for h in history[:5]),
        "reward_last5": statistics.mean(h["rewards/env_reward/mean"] for h in history[-5:]),
        "completion_length_mean": statistics.mean(h.get("completions/mean_length", 0.0)
                                                  for h in history),
        "tool_calls_per_episode": statistics.mean(h.get("tools/call_frequency", 0.0)
                                                  for h in history),
        "reward_per_step": [round(h["rewards/env_reward/mean"], 4) for h in history],
        "peak_rss_mb": peak_rss_mb()})


# ---------- the driver ----------


def study_recipe(hops: int, smoke: bool) -> dict[str, Any]:
    """``horizon_study.recipe(hops)`` as TRL's GRPOTrainer sees the env (smaller with ``smoke``).

    TRL renders the tools from the adapter's methods (no ``additionalProperties``,
    name order) and parses only ``<tool_call>`` JSON blocks: so the ChatML template,
    ``rollout.tool_schemas: signature`` (the same prompt on both sides) and a warm
    start on calls written in that format. Without the last two, the warm-started
    model made no call TRL could parse and TRL's reward was 0 from its first step.
    """
    from horizon_study import recipe

    r = recipe(hops)
    r["chat_template"] = "chatml"
    r["rollout"]["tool_schemas"] = "signature"
    r["warm_start"]["demonstration_format"] = "template"
    # A JSON-block turn is ~22 tokens against the compact call's ~6: the tiny model's
    # copy-from-observation phase change came at ~900 supervised steps on one seed and
    # not within 1,500 on another (held-out greedy success 0.16 and 0.00 at 1,500), so
    # a longer maximum (it still stops at the recipe's held-out target).
    r["warm_start"]["steps"] = 4000
    if smoke:
        r["warm_start"].update({"steps": 4, "episodes": 32, "holdout_episodes": 8,
                                "target_success": None, "min_sampled_success": None})
        r["eval"]["episodes"] = 16
    return r


def trl_run(args: argparse.Namespace, seed: int, sao_run: Path, warm: Path) -> Path:
    """TRL from ``warm`` for ``sao_run``'s loop time; evaluated as ``sao_run`` was."""
    from learning_study import log

    config = yaml.safe_load((sao_run / "config.yaml").read_text())
    run_dir = args.out / "runs" / "trl" / f"seed{seed}"
    result = run_dir / "eval_after.json"
    if result.exists():
        return run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    turns = episode_turns(config["env"], config["env_kwargs"])
    new_tokens = config["rollout"]["max_new_tokens"]
    spec = {"run_dir": str(run_dir), "model": str(warm / "model" / "warm_start"),
            "env": config["env"], "env_kwargs": config["env_kwargs"], "seed": seed,
            "wall_s": sao_wall_s(sao_run), "lr": args.lr or config["learner"]["lr"],
            "batch": config["rollout"]["batch_size"], "generations": args.generations,
            "max_turns": turns, "completion_tokens": turns * (new_tokens + args.obs_tokens)}
    if not (run_dir / "train.json").exists():
        write_json(run_dir / "spec.json", spec)
        log(f"start TRL, seed {seed}: {spec['wall_s']:.0f} s")
        run_logged([sys.executable, str(Path(__file__).resolve()), "--trl-worker",
                    str(run_dir / "spec.json")], run_dir / "train.log", child_env(1),
                   f"the TRL run of seed {seed}")
    log(f"TRL, seed {seed}: evaluating")
    shutil.copy(warm / "eval_before.json", run_dir / "eval_before.json")
    trajectories = run_dir / "heldout_trajectories"  # read by policy_episode_kinds
    shutil.rmtree(trajectories, ignore_errors=True)
    cmd = [*eval_command(run_dir / "policy", config, result), "--trajectories", str(trajectories)]
    with (run_dir / "eval.log").open("a") as f:
        subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, check=True, env=child_env(1))
    log(f"done TRL, seed {seed}")
    return run_dir


def run_seed(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """Warm start, SAO, then TRL for SAO's wall time: the seed's three evaluations."""
    import learning_study as ls

    warm = ls.warm_start(args.out, seed)
    fitted = yaml.safe_load((warm / "config.yaml").read_text())["rollout"]["max_new_tokens"]
    sao_run = ls.train(args.out, warm, "SAO", [f"rollout.max_new_tokens={fitted}"], seed,
                       args.steps)
    trl_dir = trl_run(args, seed, sao_run, warm)
    config = yaml.safe_load((sao_run / "config.yaml").read_text())
    sao_policy = sorted((sao_run / "checkpoints").glob("step_*"))[-1] / "policy"
    kept_eval_trajectories(sao_run)
    kinds = {"sao": policy_episode_kinds(sao_policy, config, sao_run),
             "trl": policy_episode_kinds(trl_dir / "policy", config, trl_dir)}
    return {"seed": seed, "before": read_json(warm / "eval_before.json"), "kinds": kinds,
            "sao": read_json(sao_run / "eval_after.json"),
            "trl": read_json(trl_dir / "eval_after.json"),
            "sao_wall_s": round(sao_wall_s(sao_run), 1),
            "sao_trajectories": config["total_steps"] * config["rollout"]["batch_size"],
            "trl_train": read_json(trl_dir / "train.json")}


def archived_seed(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """:func:`run_seed`, or its result as ``--archive`` kept it from an earlier invocation.

    A finished seed leaves ``ARCHIVE/seedN.json`` (its result) and
    ``ARCHIVE/sao-seedN-metrics.jsonl.gz`` (the SAO run's metrics); the archive's
    ``study.yaml`` must be this invocation's recipe.
    """
    if args.archive is None:
        return run_seed(args, seed)
    kept = args.archive / f"seed{seed}.json"
    if kept.exists():
        return read_json(kept)
    result = run_seed(args, seed)
    metrics = args.out / "runs" / "sao" / f"seed{seed}" / "metrics.jsonl"
    with metrics.open("rb") as f, (args.archive / f"sao-seed{seed}-metrics.jsonl.gz").open(
            "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as g:
        shutil.copyfileobj(f, g)
    write_json(kept, result)
    return result


def _rate(summary: dict[str, Any]) -> float:
    return float(summary["success_rate"])


def _cell(summary: dict[str, Any]) -> str:
    from sao_gym.evaluation import summary_interval

    lo, hi = summary_interval(summary)
    return f"{_rate(summary):.3f} [{lo:.3f}, {hi:.3f}]"


def report(out: Path, results: list[dict[str, Any]]) -> str:
    lines = ["## TRL GRPOTrainer vs SAO: the same warm start and wall clock\n",
             "| seed | before | SAO after | TRL after | SAO: trajectories / s of loop | "
             "TRL: trajectories / s of loop | TRL train reward first 5 -> last 5 steps | "
             "TRL tool calls / episode |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        t = r["trl_train"]
        lines.append(f"| {r['seed']} | {_cell(r['before'])} | {_cell(r['sao'])} | "
                     f"{_cell(r['trl'])} | {r['sao_trajectories']} / {r['sao_wall_s']:.0f} | "
                     f"{t['trajectories']} / {t['wall_s']:.0f} | "
                     f"{t['reward_first5']:.3f} -> {t['reward_last5']:.3f} | "
                     f"{t['tool_calls_per_episode']:.2f} |")
    kinds = [(r["seed"], side, r["kinds"][side]) for r in results if "kinds" in r
             for side in ("sao", "trl")]
    if kinds:
        names = list(kinds[0][2])
        lines += ["", "How the held-out episodes ended (`episode_kinds`):", "",
                  "| seed | side | " + " | ".join(names) + " |",
                  "|---|---|" + "---|" * len(names)]
        lines += [f"| {seed} | {side.upper()} | " + " | ".join(str(k[n]) for n in names) + " |"
                  for seed, side, k in kinds]
    gains = [(_rate(r["sao"]) - _rate(r["before"]), _rate(r["trl"]) - _rate(r["before"]))
             for r in results]
    if gains:
        lines.append(f"\nGain over the warm start, mean over seeds: SAO "
                     f"{statistics.mean(g[0] for g in gains):+.3f}, TRL "
                     f"{statistics.mean(g[1] for g in gains):+.3f}\n")
    text = "\n".join(lines)
    (out / "table.md").write_text(text + "\n")
    write_json(out / "results.json", results)
    return text


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trl-worker", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path)
    p.add_argument("--hops", type=int, default=8)
    p.add_argument("--steps", type=int, default=200, help="SAO's learner steps")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--generations", type=int, default=8)
    p.add_argument("--lr", type=float, default=None, help="TRL's (default: the recipe's)")
    p.add_argument("--obs-tokens", type=int, default=OBS_TOKENS)
    p.add_argument("--parallel", type=int, default=2)
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--archive", type=Path, default=None,
                   help="keep each finished seed's result here and reuse it next time "
                        "(the checked-in one: docs/data/vs_trl_heldout)")
    args = p.parse_args(argv)
    if args.trl_worker:
        trl_worker(args.trl_worker)
        return
    if args.out is None:
        p.error("--out is required")
    (args.out / "logs").mkdir(parents=True, exist_ok=True)
    study, want = args.out / "study.yaml", study_recipe(args.hops, args.smoke)
    if not study.exists():
        study.write_text(yaml.safe_dump(want, sort_keys=False))
    elif yaml.safe_load(study.read_text()) != want:
        raise SystemExit(f"{study} differs from this script's recipe: use another --out")
    if args.archive is not None:
        args.archive.mkdir(parents=True, exist_ok=True)
        kept = args.archive / "study.yaml"
        if not kept.exists():
            shutil.copy(study, kept)
        elif yaml.safe_load(kept.read_text()) != want:
            raise SystemExit(f"{kept} differs from this script's recipe: use another --archive")
    with ThreadPoolExecutor(args.parallel) as pool:
        results = list(pool.map(lambda s: archived_seed(args, s), args.seeds))
    print(report(args.out, results))


if __name__ == "__main__":
    main()
