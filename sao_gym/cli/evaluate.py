"""``sao-gym eval``: held-out success of a run's policy or of a model, as JSON."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from sao_gym.cli.extras import missing_train_extra


def cmd_eval(args: argparse.Namespace) -> int:
    """``sao-gym eval``: evaluate a run's latest checkpoint or a model; JSON on stdout."""
    missing = missing_train_extra()
    if missing:
        print(f"error: {missing}", file=sys.stderr)
        return 2
    from sao_gym.runtime.config.build import eval_plan
    from sao_gym.runtime.config.loader import load_config
    from sao_gym.runtime.config.schema import ConfigError
    from sao_gym.runtime.loop.checkpoint import CheckpointManager
    from sao_gym.runtime.plans import EVAL_SEED

    overrides = []
    if args.env is not None:
        overrides += [f"env={args.env}", "env_kwargs={}"]
    if args.env_kwargs is not None:
        try:
            kwargs = yaml.safe_load(args.env_kwargs)
        except yaml.YAMLError:
            kwargs = None
        if not isinstance(kwargs, dict):
            print(f"error: --env-kwargs must be a YAML mapping, got {args.env_kwargs!r}",
                  file=sys.stderr)
            return 2
        overrides.append(f"env_kwargs={json.dumps(kwargs)}")
    if args.temperature is not None:
        overrides.append(f"eval.temperature={args.temperature}")
    if args.max_new_tokens is not None:
        overrides.append(f"rollout.max_new_tokens={args.max_new_tokens}")
    if args.max_context_tokens is not None:
        overrides.append(f"rollout.max_context_tokens={args.max_context_tokens}")
    overrides += args.set
    run_dir = Path(args.run) if args.run else None
    step = None
    plan = None
    try:
        if run_dir is not None:  # as the run evaluated: its saved (fitted) config
            done = CheckpointManager(run_dir).complete()
            if not done:
                raise ConfigError(f"{run_dir} has no complete checkpoint")
            if not (run_dir / "config.yaml").is_file():
                raise ConfigError(f"{run_dir} is not a run directory (no config.yaml)")
            config = load_config(run_dir / "config.yaml", overrides)
            step, latest = done[-1]
            model, out = str(latest / "policy"), args.out or str(run_dir / "eval.json")
            keep = args.keep or f"eval_step{step}"
        else:
            if args.env is None:
                raise ConfigError("--env is required with --model")
            config = load_config(None, ["rollout.max_new_tokens=64",
                                        "rollout.max_context_tokens=2048", *overrides])
            model, out = args.model, args.out
            if args.keep:
                raise ConfigError("--keep names a split of a run's rollouts: use it with --run")
            keep = None
        if keep is not None:
            from sao_gym.rollout_store import check_split

            try:
                check_split(keep)
            except ValueError as e:
                raise ConfigError(f"--keep: {e}") from None
        plan = eval_plan(config, episodes=args.episodes, seed=args.seed or EVAL_SEED)
        if not plan.episodes:  # a run that evaluated nothing: the command's default
            plan = dataclasses.replace(plan, episodes=64)
        plan.rollouts.env().close()
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - any failure to build is a setup error
        what = plan.env_id if plan is not None else args.env
        print(f"error: cannot make env {what!r}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    from sao_gym.runtime.loop.source import RolloutsFailing

    try:
        with tempfile.TemporaryDirectory(prefix="sao-gym-eval-") as tmp:
            if run_dir is None:  # `tiny` is built here, `smollm2` converted once and cached
                from sao_gym.models import resolve_model

                model = resolve_model(model, Path(tmp), seed=0)
            rollouts: list[Any] = []
            result = evaluate_with_progress(plan, model, run_dir or Path(tmp), keep=keep,
                                            step=step, into=rollouts)
            if args.trajectories:
                n = write_trajectories(rollouts, model, args.trajectories, plan.model_name)
                print(f"{n} ATIF trajectories -> {args.trajectories}", file=sys.stderr)
    except (OSError, ValueError, TypeError) as e:  # TypeError: options the env does not take
        print(f"error: {e}", file=sys.stderr)
        return 2
    except RolloutsFailing as e:  # every episode failed: nothing to report
        print(f"error: {e}", file=sys.stderr)
        return 1
    if keep is not None:
        print(f"episodes kept: split {keep} of {run_dir} (sao-gym view {run_dir})",
              file=sys.stderr)
    text = json.dumps(result, indent=2)
    print(text)
    if out:
        Path(out).write_text(text + "\n")
    if result.get("infra_failures"):
        print(f"note: {result['infra_failures']} of {result['episodes']} episodes were infra "
              "failures (not averaged in); see the log", file=sys.stderr)
    return 0


def write_trajectories(rollouts: list[Any], model: str, out: str, model_name: str) -> int:
    """The evaluation's episodes (in seed order) as ATIF files in ``out``; how many."""
    from transformers import AutoTokenizer

    from sao_gym.adapters.atif import trajectory, write_trajectories
    from sao_gym.rollout_store import rollout_record
    from sao_gym.runtime.loop.recorder import TokenText

    text = TokenText(AutoTokenizer.from_pretrained(model))
    ordered = sorted(rollouts, key=lambda r: (r.seed is None, r.seed or 0))
    return write_trajectories(
        (trajectory({"id": i, **rollout_record(r, split="eval", token_text=text(r.token_ids))},
                    model_name=model_name, session_id="sao-gym-eval")
         for i, r in enumerate(ordered)), out)


def evaluate_with_progress(plan: Any, model: str, run_dir: Path, keep: str | None = None,
                           step: int | None = None, into: list[Any] | None = None) -> dict:
    """:func:`~sao_gym.runtime.job.evaluate` of an eval plan with a progress bar on stderr.

    ``keep``: the split of ``run_dir``'s rollouts the episodes are kept in (``step``:
    the checkpoint's learner step, recorded with them); ``into`` receives every
    episode's rollout.
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from sao_gym.runtime.job import evaluate

    columns = ("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
               "success {task.fields[success]}", TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        bar = progress.add_task(f"evaluating on {plan.env_id}", total=plan.episodes,
                                success="-")
        solved = [0, 0]

        def done(rollout: Any) -> None:
            if into is not None:
                into.append(rollout)
            solved[0] += rollout.reward >= 1.0 and not rollout.infra_failure
            solved[1] += 1
            progress.update(bar, advance=1, success=f"{solved[0] / solved[1]:.3f}")

        return evaluate(plan, model, run_dir=run_dir, on_done=done, keep=keep, step=step)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``eval`` to the subcommands of ``sao-gym``."""
    ev = sub.add_parser("eval", help="evaluate a run's policy or a model on an environment")
    which = ev.add_mutually_exclusive_group(required=True)
    which.add_argument("--run", help="a run directory (its latest checkpoint)")
    which.add_argument("--model", help="a Hugging Face checkpoint directory, `tiny` (the "
                       "demo's random tiny model) or `smollm2`")
    ev.add_argument("--env", help="environment id (default: the run's)")
    ev.add_argument("--env-kwargs", metavar="YAML",
                    help="environment options as a YAML mapping, e.g. '{operators: \"+\"}' "
                    "(default: the run's, when --env is not given; else none)")
    ev.add_argument("--episodes", type=int,
                    help="episodes (default: the run's eval.episodes; 64 with --model)")
    ev.add_argument("--seed", type=int, help="first episode seed (default 1000000, as the "
                    "run's own evaluations)")
    ev.add_argument("--temperature", type=float,
                    help="sampling temperature (default: the run's; 1.0 with --model)")
    ev.add_argument("--max-new-tokens", type=int,
                    help="tokens per turn (default: the run's; 64 with --model)")
    ev.add_argument("--max-context-tokens", type=int,
                    help="tokens per episode (default: the run's; 2048 with --model)")
    ev.add_argument("--out", help="also write the JSON here (default RUN_DIR/eval.json)")
    ev.add_argument("--keep", metavar="NAME",
                    help="with --run: the split of the run's rollouts the episodes are kept in, "
                         "for `sao-gym view` (default eval_stepN, N the checkpoint's step)")
    ev.add_argument("--trajectories", metavar="OUT",
                    help="also write every episode as an ATIF trajectory (Harbor's format) "
                         "into this directory")
    ev.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="any other config key, dotted (rollout.tool_schemas=signature, "
                         "rollout.max_episode_steps=20, ...); applied last")
    ev.set_defaults(fn=cmd_eval)
