"""The ``sao-gym`` command.

Subcommands:
    envs                      list registered environment ids
    check ENV_ID [--episodes N]
                              run the conformance checks and N random episodes
    train [CONFIG.yaml] [--set key=value ...] [--out RUN_DIR] [--resume RUN_DIR]
                              train (no config: the embedded default main job)
    eval (--run RUN_DIR | --model PATH) [--env ID] [--episodes N]
                              success rate, mean return and turns, as JSON
    plot RUN_DIR [--compare RUN_DIR2 ...] [--out DIR] [--smooth W]
                              write PNG learning curves of runs' metrics.jsonl
    view RUN_DIR [RUN_DIR ...] [--host H] [--port P]
                              curves, episodes and token strips of runs, in the browser
    bench async-vs-sync [--set key=value ...] [--repeats N]
                              training throughput of async vs sync mode
    serve MODEL [--port P] [--host H] [--served-model-name NAME] [--max-batch-size N]
                              serve a model over vLLM's RL protocol (HFBackend, no vLLM)
    serve-env ENV_ID [--port P] [--host H] [--env-kwargs JSON] [--max-sessions N]
                              serve an environment over OpenEnv's protocol (openenv extra)
    sandbox build-image [--tag T] [--extra-packages P,Q] [--rebuild]
                              build the DockerSandbox image offline (root)
    tasks make-code-repo --package NAME [--out FILE] [--max-tasks N] [--seed S]
                              bug-injection tasks for the code-repository env from a
                              package's tests
    export harbor ENV_ID (--tasks ID,ID | --seeds S,S | --count N) OUT
                              write Harbor task directories (envs with a Harbor exporter)
    export atif RUN_DIR OUT [--split NAME ...]
                              write a run's kept rollouts as ATIF trajectories (JSON)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

import sao_gym


def _cmd_envs(args: argparse.Namespace) -> int:
    for env_id in sao_gym.env_ids():
        print(env_id)
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    import warnings

    from sao_gym.agents import RandomAgent
    from sao_gym.evaluation import EpisodeSummary, run_episodes
    from sao_gym.utils.env_checker import (
        EnvCheckError,
        EnvCheckWarning,
        OncePerError,
        check_agent_env,
    )

    try:
        env = sao_gym.make(args.env_id)
    except Exception as e:  # noqa: BLE001 - the CLI reports any failure to build
        if getattr(args, "verbose", False):
            logging.getLogger("sao_gym.cli").exception("cannot make %s", args.env_id)
        reason = " ".join(f"{type(e).__name__}: {e}".split())  # one line, however it reads
        print(f"FAIL: cannot make {args.env_id}: {reason}", file=sys.stderr)
        return 2
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", EnvCheckWarning)
            passed = check_agent_env(env)
    except EnvCheckError as e:
        print(f"FAIL: {args.env_id}\n{e}", file=sys.stderr)
        return 1
    for name in passed:
        print(f"ok   {name}")
    for w in caught:
        if issubclass(w.category, EnvCheckWarning):
            print(f"warn {w.message}")
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if args.episodes:
        # each episode its own env seed and agent seed (seed, seed+1, ...); a traceback
        # that every episode would repeat is shown once, then counted
        with OncePerError() as errors:
            rollouts = asyncio.run(run_episodes(
                lambda: sao_gym.make(args.env_id), lambda seed: RandomAgent(seed=seed),
                args.episodes, seed=args.seed, seed_agents=True,
            ))
        for line in errors.summary():
            print(line, file=sys.stderr)
        summary = EpisodeSummary.of(rollouts)
        if summary.infra_failures:
            reasons = sorted({r.stop_reason.value for r in rollouts if r.infra_failure})
            print(f"FAIL: {summary.infra_failures}/{args.episodes} random episodes crashed "
                  f"({', '.join(reasons)}); see the log above", file=sys.stderr)
            return 1
        print(f"ok   {args.episodes} random episodes: mean turns {summary.turns_mean:.1f}, "
              f"mean return {summary.return_mean:.3f}")
    print(f"PASS: {args.env_id}")
    return 0


def _missing_train_extra() -> str | None:
    """A one-line error when the ``train`` extra (torch, transformers) is not installed."""
    import importlib.util

    missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        return (f"this command needs the `train` extra ({', '.join(missing)} not installed): "
                "pip install 'sao-gym[train]'")
    return None


def _default_recipe(overrides: list[str]) -> str:
    """The recipe of ``sao-gym train`` without a config file.

    ``cpu`` (the generic CPU recipe, fitted to the env) when ``--set env=...``
    names an env, else ``demo`` (the embedded demo and its env).
    """
    named = any(o.partition("=")[0].strip() == "env" for o in overrides)
    return "cpu" if named else "demo"


def _cmd_train(args: argparse.Namespace) -> int:
    import time

    from rich.console import Console

    from sao_gym.progress import ProgressDisplay
    from sao_gym.runtime.build import check_setup
    from sao_gym.runtime.config import ConfigError
    from sao_gym.runtime.loader import load_config, recipe_path

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
            config = load_config(args.config or recipe_path(_default_recipe(args.set)), args.set)
            run_dir = Path(args.out or f"runs/{time.strftime('%Y%m%d-%H%M%S')}-{config.algorithm}")
            if (run_dir / "metrics.jsonl").exists():
                raise ConfigError(f"{run_dir} already holds a run: use --resume {run_dir} "
                                  "or another --out")
        missing = _missing_train_extra()
        if missing:
            raise ConfigError(missing)
        check_setup(config)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from sao_gym.runtime.job import train

    console.print(f"[bold]sao-gym train[/]: {config.algorithm} ({config.mode}) on {config.env}, "
                  f"model {config.model}, {config.total_steps} steps -> {run_dir}")
    from sao_gym.inference.base import InferenceError
    from sao_gym.runtime.probe import SamplerMismatch
    from sao_gym.runtime.ranks import RankDied
    from sao_gym.runtime.ray.learner import LearnerDied
    from sao_gym.runtime.source import RolloutsFailing

    try:
        with ProgressDisplay(config.total_steps, console=console) as display:
            result = train(config, run_dir, resume=bool(args.resume), display=display,
                           say=lambda text: console.print(text, style="dim", markup=False,
                                                          highlight=False, soft_wrap=True))
    except (InferenceError, RolloutsFailing, LearnerDied, RankDied, SamplerMismatch) as e:
        print(f"error: {e}", file=sys.stderr)
        if (run_dir / "checkpoints").is_dir():
            print(f"(checkpoints kept: `sao-gym train --resume {run_dir}` continues)",
                  file=sys.stderr)
        return 1
    _print_result(result)
    return 0


def _print_result(result: dict) -> None:
    """The job's result; an interrupted run (SIGINT/SIGTERM) says where it stopped, no gain."""
    print(f"run dir:    {result['run_dir']}")
    print(f"checkpoint: {result.get('checkpoint')}")
    before, after = result.get("eval_before"), result.get("eval_after")
    if result.get("interrupted"):
        print(f"stopped:    interrupted at step {result.get('steps_done')} of "
              f"{result.get('total_steps')}, the trained model not evaluated "
              f"(`sao-gym train --resume {result['run_dir']}` continues)")
    elif before and after:
        for line in _gain_lines(before, after):
            print(line)
    for path in result.get("plots", []):
        print(f"plot:       {path}")


def _gain_lines(before: dict, after: dict) -> list[str]:
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


def _cmd_eval(args: argparse.Namespace) -> int:
    missing = _missing_train_extra()
    if missing:
        print(f"error: {missing}", file=sys.stderr)
        return 2
    from sao_gym.runtime.checkpoint import CheckpointManager
    from sao_gym.runtime.config import ConfigError
    from sao_gym.runtime.job import EVAL_SEED, resolve_model
    from sao_gym.runtime.loader import load_config

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
    try:
        if run_dir is not None:  # as the run evaluated: its saved (fitted) config
            latest = CheckpointManager(run_dir).latest()
            if latest is None:
                raise ConfigError(f"{run_dir} has no complete checkpoint")
            if not (run_dir / "config.yaml").is_file():
                raise ConfigError(f"{run_dir} is not a run directory (no config.yaml)")
            config = load_config(run_dir / "config.yaml", overrides)
            model, out = str(latest / "policy"), args.out or str(run_dir / "eval.json")
            keep = args.keep or f"eval_step{int(latest.name.split('_')[-1])}"
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
        sao_gym.make(config.env, **config.env_kwargs).close()
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - any failure to build is a setup error
        print(f"error: cannot make env {config.env!r}: {type(e).__name__}: {e}",
              file=sys.stderr)
        return 2
    episodes = args.episodes if args.episodes is not None else config.eval.episodes or 64
    try:
        with tempfile.TemporaryDirectory(prefix="sao-gym-eval-") as tmp:
            if run_dir is None:  # `tiny` is built here, `smollm2` converted once and cached
                model = resolve_model(model, Path(tmp), seed=0)
            rollouts: list[Any] = []
            result = _evaluate_with_progress(config, model, episodes, args.seed or EVAL_SEED,
                                             run_dir or Path(tmp), keep=keep, into=rollouts)
            if args.trajectories:
                n = _write_trajectories(rollouts, model, args.trajectories, config.model)
                print(f"{n} ATIF trajectories -> {args.trajectories}", file=sys.stderr)
    except (OSError, ValueError, TypeError) as e:  # TypeError: options the env does not take
        print(f"error: {e}", file=sys.stderr)
        return 2
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


def _write_trajectories(rollouts: list[Any], model: str, out: str, model_name: str) -> int:
    """The evaluation's episodes (in seed order) as ATIF files in ``out``; how many."""
    from transformers import AutoTokenizer

    from sao_gym.adapters.atif import trajectory, write_trajectories
    from sao_gym.rollout_store import rollout_record
    from sao_gym.runtime.recorder import TokenText

    text = TokenText(AutoTokenizer.from_pretrained(model))
    ordered = sorted(rollouts, key=lambda r: (r.seed is None, r.seed or 0))
    return write_trajectories(
        (trajectory({"id": i, **rollout_record(r, split="eval", token_text=text(r.token_ids))},
                    model_name=model_name, session_id="sao-gym-eval")
         for i, r in enumerate(ordered)), out)


def _evaluate_with_progress(config: Any, model: str, episodes: int, seed: int,
                            run_dir: Path, keep: str | None = None,
                            into: list[Any] | None = None) -> dict:
    """:func:`~sao_gym.runtime.job.evaluate` with a progress bar on stderr.

    ``keep``: the split of ``run_dir``'s rollouts the episodes are kept in;
    ``into`` receives every episode's rollout.
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from sao_gym.runtime.job import evaluate

    columns = ("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
               "success {task.fields[success]}", TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        bar = progress.add_task(f"evaluating on {config.env}", total=episodes, success="-")
        solved = [0, 0]

        def done(rollout: Any) -> None:
            if into is not None:
                into.append(rollout)
            solved[0] += rollout.reward >= 1.0 and not rollout.infra_failure
            solved[1] += 1
            progress.update(bar, advance=1, success=f"{solved[0] / solved[1]:.3f}")

        step = None
        if keep is not None:
            from sao_gym.runtime.checkpoint import CheckpointManager

            latest = CheckpointManager(run_dir).latest()
            step = int(latest.name.split("_")[-1]) if latest is not None else None
        return evaluate(config, model, episodes=episodes, seed=seed, run_dir=run_dir,
                        on_done=done, keep=keep, step=step)


def _cmd_export_atif(args: argparse.Namespace) -> int:
    from sao_gym.adapters.atif import export_run

    if not Path(args.run_dir).is_dir():
        print(f"error: {args.run_dir}: no such directory", file=sys.stderr)
        return 2
    try:
        counts = export_run(args.run_dir, args.out_dir, splits=args.split or None)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for split, n in counts.items():
        print(f"{split}: {n} trajectories -> {Path(args.out_dir) / split}")
    return 0


def _cmd_view(args: argparse.Namespace) -> int:
    from sao_gym.viewer.server import check_run_dirs, serve

    try:
        check_run_dirs(args.run_dirs)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        serve(args.run_dirs, host=args.host, port=args.port,
              say=lambda line: print(line, file=sys.stderr, flush=True))
    except OSError as e:  # the port is taken, the address is not this machine's
        print(f"error: cannot serve on {args.host}:{args.port}: {e}", file=sys.stderr)
        return 2
    return 0


def _cmd_plot(args: argparse.Namespace) -> int:
    from sao_gym.plotting import plot_runs

    try:
        paths = plot_runs(args.run_dir, args.compare, args.out, smooth=args.smooth)
    except (FileNotFoundError, ValueError) as e:
        print(f"FAIL: {e}", file=sys.stderr)
        return 1
    if not paths:
        print("FAIL: nothing to plot: no run has any plotted metric "
              "(see docs/metrics.md)", file=sys.stderr)
        return 1
    for path in paths:
        print(path)
    return 0


def _cmd_bench_async_vs_sync(args: argparse.Namespace) -> int:
    from sao_gym.runtime.bench import async_vs_sync
    from sao_gym.runtime.config import ConfigError

    try:
        result = async_vs_sync(args.set, repeats=args.repeats)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for mode in ("async", "sync"):
        runs = ", ".join(f"{x:.2f}" for x in result["runs"][mode])
        print(f"{mode:>5}: {result[f'{mode}_trajectories_per_s']:.2f} trajectories/s "
              f"(median of {runs})")
    print(f"ratio: {result['ratio']:.2f}x async/sync, {result['trajectories']} trajectories each")
    keys = ("async_trajectories_per_s", "sync_trajectories_per_s", "ratio")
    print(json.dumps({k: round(result[k], 4) for k in keys}))
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    missing = _missing_train_extra()
    if missing:
        print(missing, file=sys.stderr)
        return 2
    from sao_gym.inference.server import serve
    from sao_gym.runtime.job import resolve_model

    if args.threads is not None and args.threads < 1:
        print(f"error: --threads must be >= 1, got {args.threads}", file=sys.stderr)
        return 2

    logging.getLogger("sao_gym").setLevel(logging.INFO)
    try:
        path = resolve_model(args.model, Path(tempfile.mkdtemp(prefix="sao-gym-serve-")),
                             args.seed or 0)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"serving {path} as {args.served_model_name!r} on http://{args.host}:{args.port}",
          flush=True)
    serve(path, host=args.host, port=args.port, served_model_name=args.served_model_name,
          max_batch_size=args.max_batch_size, max_model_len=args.max_model_len, seed=args.seed,
          dtype=args.dtype, threads=args.threads)
    return 0


def _cmd_serve_env(args: argparse.Namespace) -> int:
    try:
        kwargs = json.loads(args.env_kwargs) if args.env_kwargs else {}
    except ValueError:
        kwargs = None
    if not isinstance(kwargs, dict):
        print(f"error: --env-kwargs must be a JSON object, got {args.env_kwargs!r}",
              file=sys.stderr)
        return 2
    if args.max_sessions < 1:
        print(f"error: --max-sessions must be >= 1, got {args.max_sessions}", file=sys.stderr)
        return 2
    try:
        from sao_gym.adapters.openenv import create_app, serve_app

        app = create_app(args.env_id, max_concurrent_envs=args.max_sessions, **kwargs)
    except (ImportError, ValueError) as e:  # a missing extra, a bad env id or option
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"serving {args.env_id} over OpenEnv on http://{args.host}:{args.port} "
          f"(WebSocket /ws, up to {args.max_sessions} sessions)", flush=True)
    serve_app(app, host=args.host, port=args.port)
    return 0


def _cmd_sandbox_build_image(args: argparse.Namespace) -> int:
    from sao_gym.sandbox.base import SandboxUnavailable
    from sao_gym.sandbox.image import build_image

    packages = [p.strip() for p in args.extra_packages.split(",") if p.strip()]
    try:
        image_id = build_image(args.tag, extra_packages=packages, rebuild=args.rebuild)
    except (SandboxUnavailable, RuntimeError, ValueError) as e:
        print(f"FAIL: {e}", file=sys.stderr)
        return 1
    print(f"{args.tag} {image_id}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``sao-gym``."""
    parser = argparse.ArgumentParser(prog="sao-gym", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("envs", help="list registered environments").set_defaults(fn=_cmd_envs)
    check = sub.add_parser("check", help="check an environment's conformance")
    check.add_argument("env_id")
    check.add_argument("--episodes", type=int, default=10, help="random-agent episodes")
    check.add_argument("--seed", type=int, default=0)
    check.set_defaults(fn=_cmd_check)
    train = sub.add_parser("train", help="train an agent (no config: the embedded default)")
    train.add_argument("config", nargs="?", help="YAML config (see examples/configs/; "
                       "default: the generic CPU recipe, sao_gym/recipes/cpu.yaml, fitted "
                       "to the env of --set env=ID, or without it the demo, demo.yaml)")
    train.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config key, dotted: rollout.batch_size=8; repeatable")
    train.add_argument("--out", help="run directory (default runs/<time>-<algorithm>)")
    train.add_argument("--resume", metavar="RUN_DIR",
                       help="continue a run from its last checkpoint")
    train.set_defaults(fn=_cmd_train)
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
    ev.set_defaults(fn=_cmd_eval)
    plot = sub.add_parser("plot", help="write PNG learning curves of one or more runs")
    plot.add_argument("run_dir", help="a run directory with metrics.jsonl")
    plot.add_argument("--compare", nargs="+", action="extend", default=[], metavar="RUN_DIR",
                      help="more runs drawn in the same figures")
    plot.add_argument("--out", default=None, help="output folder (default RUN_DIR/plots)")
    plot.add_argument("--smooth", type=float, default=0.9,
                      help="EMA weight in [0, 1) (default 0.9; 0: raw curves only)")
    plot.set_defaults(fn=_cmd_plot)
    view = sub.add_parser("view", help="look at runs in the browser: curves, episodes, tokens")
    view.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories")
    view.add_argument("--host", default="127.0.0.1",
                      help="address to listen on (default 127.0.0.1, this machine only; any "
                           "other address serves the runs to whoever can reach it)")
    view.add_argument("--port", type=int, default=8765, help="port (default 8765)")
    view.set_defaults(fn=_cmd_view)
    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    avs = bench_sub.add_parser("async-vs-sync", help="training throughput, async vs sync mode")
    avs.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="override the benchmark's train config (see sao_gym.runtime.bench)")
    avs.add_argument("--repeats", type=int, default=1, help="alternating runs per mode")
    avs.set_defaults(fn=_cmd_bench_async_vs_sync)
    srv = sub.add_parser("serve", help="serve a model over HTTP with vLLM's RL routes "
                         "(completions with token ids and logprobs, pause/resume, reload)")
    srv.add_argument("model", help="a Hugging Face checkpoint directory, `tiny` or `smollm2`")
    srv.add_argument("--host", default="127.0.0.1")
    srv.add_argument("--port", type=int, default=8000)
    srv.add_argument("--served-model-name", default="policy")
    srv.add_argument("--max-batch-size", type=int, default=32,
                     help="most sequences decoded together")
    srv.add_argument("--max-model-len", type=int, default=None,
                     help="context limit (default: the model's positions)")
    srv.add_argument("--dtype", default="float32")
    srv.add_argument("--threads", type=int, default=None,
                     help="torch CPU threads (default: one per core)")
    srv.add_argument("--seed", type=int, default=None,
                     help="stream of requests sent without a seed")
    srv.set_defaults(fn=_cmd_serve)
    senv = sub.add_parser("serve-env", help="serve an environment over OpenEnv's protocol "
                          "(reset/step over WebSocket, MCP list_tools/call_tool actions)")
    senv.add_argument("env_id")
    senv.add_argument("--host", default="127.0.0.1")
    senv.add_argument("--port", type=int, default=8000)
    senv.add_argument("--env-kwargs", metavar="JSON", default=None,
                      help='environment options as a JSON object, e.g. \'{"operators": "+"}\' '
                      '("max_episode_steps" sets the turn limit)')
    senv.add_argument("--max-sessions", type=int, default=32,
                      help="concurrent WebSocket sessions (each has its own environment)")
    senv.set_defaults(fn=_cmd_serve_env)
    sandbox = sub.add_parser("sandbox", help="sandbox maintenance")
    sandbox_sub = sandbox.add_subparsers(dest="sandbox_command", required=True)
    build = sandbox_sub.add_parser("build-image", help="build the DockerSandbox image offline "
                                   "(debootstrap + docker import; needs root and a daemon)")
    build.add_argument("--tag", default="sao-gym-sandbox:latest")
    build.add_argument("--extra-packages", default="", help="comma-separated Debian packages")
    build.add_argument("--rebuild", action="store_true", help="rebuild when the tag exists")
    build.set_defaults(fn=_cmd_sandbox_build_image)
    tasks = sub.add_parser("tasks", help="make task files for environments")
    tasks_sub = tasks.add_subparsers(dest="tasks_command", required=True)
    from sao_gym.envs.code_repo.cli import add_parser as add_code_repo_tasks

    add_code_repo_tasks(tasks_sub)
    from sao_gym.adapters.harbor import add_export_parser

    export = sub.add_parser("export", help="export tasks or trajectories to other formats")
    export_sub = export.add_subparsers(dest="export_command", required=True)
    add_export_parser(export_sub)
    atif = export_sub.add_parser(
        "atif", help="write a run's kept rollouts as ATIF trajectories (Harbor's format)",
        description="Write each kept rollout of RUN_DIR (training samples and evaluations) "
                    "as an ATIF-v1.8 trajectory, OUT/<split>/<split>-<id>.json.")
    atif.add_argument("run_dir", metavar="RUN_DIR", help="a run directory")
    atif.add_argument("out_dir", metavar="OUT", help="output directory")
    atif.add_argument("--split", action="append", default=[], metavar="NAME",
                      help="only this split (train, eval_before, eval_after, ...); repeatable")
    atif.set_defaults(fn=_cmd_export_atif)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``sao-gym`` console script."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if not args.verbose:  # "Loading weights" bars of every model load drown the job's progress
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        return args.fn(args)
    except ModuleNotFoundError as e:
        missing = _missing_extra(e, args)
        if missing is None:
            raise
        print(f"error: {missing}", file=sys.stderr)
        return 2


def _missing_extra(error: ModuleNotFoundError, args: argparse.Namespace) -> str | None:
    """One line naming the extra to install, when ``error`` is an optional module's absence.

    Every subcommand gets the hint ``train`` and ``eval`` give up front; a module
    that is installed but fails to import its own dependencies is left as it is.
    """
    import importlib.util

    from sao_gym.registration import OPTIONAL_MODULES, MissingExtra

    if isinstance(error, MissingExtra):
        return str(error)
    top = (error.name or "").partition(".")[0]
    if top not in OPTIONAL_MODULES or importlib.util.find_spec(top) is not None:
        return None
    command = " ".join(str(v) for k, v in vars(args).items()
                       if k == "command" or k.endswith("_command"))
    return str(MissingExtra(top, OPTIONAL_MODULES[top], f"sao-gym {command}"))


if __name__ == "__main__":
    sys.exit(main())
