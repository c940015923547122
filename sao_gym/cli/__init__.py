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
import logging
import os
import sys

from sao_gym.cli import bench, envs, evaluate, export, runs, sandbox, serve, train
from sao_gym.cli.extras import missing_extra
from sao_gym.registration import env_hook, env_ids_with

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``sao-gym``: each subcommand's module adds its own."""
    parser = argparse.ArgumentParser(prog="sao-gym", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in (envs, train, evaluate, runs, bench, serve, sandbox):
        command.add_parser(sub)
    tasks = sub.add_parser("tasks", help="make task files for environments (each env "
                           "with a task maker adds its own: a 'tasks_cli' registration hook)")
    tasks_sub = tasks.add_subparsers(dest="tasks_command", required=True)
    for env_id in env_ids_with("tasks_cli"):
        env_hook(env_id, "tasks_cli")(tasks_sub)
    export.add_parser(sub)
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
        missing = missing_extra(e, args)
        if missing is None:
            raise
        print(f"error: {missing}", file=sys.stderr)
        return 2
