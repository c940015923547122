"""``sao-gym train``: a training job from a config (or a recipe), with progress, or resumed."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sao_gym.cli.extras import missing_train_extra


def default_recipe(overrides: list[str]) -> str:
    """The recipe of ``sao-gym train`` without a config file.

    ``cpu`` (the generic CPU recipe, fitted to the env) when ``--set env=...``
    names an env, else ``demo`` (the embedded demo and its env).
    """
    named = any(o.partition("=")[0].strip() == "env" for o in overrides)
    return "cpu" if named else "demo"


def cmd_train(args: argparse.Namespace) -> int:
    """``sao-gym train``: a new run, or ``--resume`` one, with progress on stderr."""
    import time

    from rich.console import Console

    from sao_gym.progress import ProgressDisplay
    from sao_gym.runtime.config.build import check_setup, train_plan
    from sao_gym.runtime.config.loader import load_config, recipe_path
    from sao_gym.runtime.config.schema import ConfigError

    console = Console(stderr=True)
    try:
        if args.resume:
            run_dir = Path(args.resume)
            if not (run_dir / "config.yaml").is_file():
                raise ConfigError(f"{run_dir} is not a run directory (no config.yaml)")
            if args.config:
                raise ConfigError("--resume takes its config from the run dir; drop CONFIG")
            config = load_config(run_dir / "config.yaml", args.set)
        else:
            config = load_config(args.config or recipe_path(default_recipe(args.set)), args.set)
        missing = missing_train_extra()
        if missing:
            raise ConfigError(missing)
        check_setup(config)
        plan = train_plan(config)
        if not args.resume:
            run_dir = Path(args.out or f"runs/{time.strftime('%Y%m%d-%H%M%S')}-"
                                       f"{plan.parts.learner.algorithm}")
            if (run_dir / "metrics.jsonl").exists():
                raise ConfigError(f"{run_dir} already holds a run: use --resume {run_dir} "
                                  "or another --out")
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from sao_gym.runtime.job import train

    console.print(f"[bold]sao-gym train[/]: {plan.title} -> {run_dir}")
    from sao_gym.inference.base import InferenceError
    from sao_gym.learner.ranks import RankDied
    from sao_gym.runtime.loop.probe import SamplerMismatch
    from sao_gym.runtime.loop.source import RolloutsFailing

    try:
        with ProgressDisplay(plan.parts.total_steps, console=console) as display:
            result = train(plan, run_dir, resume=bool(args.resume), display=display,
                           say=lambda text: console.print(text, style="dim", markup=False,
                                                          highlight=False, soft_wrap=True))
    except (InferenceError, RolloutsFailing, RankDied, SamplerMismatch) as e:
        print(f"error: {e}", file=sys.stderr)
        if (run_dir / "checkpoints").is_dir():
            print(f"(checkpoints kept: `sao-gym train --resume {run_dir}` continues)",
                  file=sys.stderr)
        return 1
    print_result(result)
    return 0


def print_result(result: dict) -> None:
    """The job's result; an interrupted run (SIGINT/SIGTERM) says where it stopped, no gain."""
    print(f"run dir:    {result['run_dir']}")
    print(f"checkpoint: {result.get('checkpoint')}")
    before, after = result.get("eval_before"), result.get("eval_after")
    if result.get("interrupted"):
        print(f"stopped:    interrupted at step {result.get('steps_done')} of "
              f"{result.get('total_steps')}, the trained model not evaluated "
              f"(`sao-gym train --resume {result['run_dir']}` continues)")
    elif before and after:
        for line in gain_lines(before, after):
            print(line)
    for path in result.get("plots", []):
        print(f"plot:       {path}")


def gain_lines(before: dict, after: dict) -> list[str]:
    """Before/after success rates with 95% intervals, and the gain with its interval."""
    from sao_gym.evaluation import summary_gain, summary_interval

    def rate(summary: dict) -> str:
        lo, hi = summary_interval(summary)
        return f"{summary['success_rate']:.3f} [{lo:.3f}, {hi:.3f}]"

    gain, lo, hi = summary_gain(before, after)
    episodes = after["episodes"] - after.get("infra_failures", 0)
    return [f"success:    {rate(before)} before -> {rate(after)} after RL "
            f"({episodes} held-out episodes, 95% intervals)",
            f"gain:       {100 * gain:+.1f} points (95% interval {100 * lo:+.1f} to "
            f"{100 * hi:+.1f})"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``train`` to the subcommands of ``sao-gym``."""
    train = sub.add_parser("train", help="train an agent (no config: the embedded default)")
    train.add_argument("config", nargs="?", help="YAML config (see examples/configs/; "
                       "default: the generic CPU recipe, sao_gym/recipes/cpu.yaml, fitted "
                       "to the env of --set env=ID, or without it the demo, demo.yaml)")
    train.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config key, dotted: rollout.batch_size=8; repeatable")
    train.add_argument("--out", help="run directory (default runs/<time>-<algorithm>)")
    train.add_argument("--resume", metavar="RUN_DIR",
                       help="continue a run from its last checkpoint")
    train.set_defaults(fn=cmd_train)
