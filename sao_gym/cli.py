"""The ``sao-gym`` command.

Subcommands:
    envs                      list registered environment ids
    check ENV_ID [--episodes N]
                              run the conformance checks and N random episodes
    demo                      evaluate the embedded tiny model on Arithmetic
    sandbox build-image [--tag T] [--extra-packages P,Q] [--rebuild]
                              build the DockerSandbox image offline (root)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from pathlib import Path

import sao_gym


def _cmd_envs(args: argparse.Namespace) -> int:
    for env_id in sao_gym.env_ids():
        print(env_id)
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    from sao_gym.agents import RandomAgent
    from sao_gym.evaluation import EpisodeSummary, run_episodes
    from sao_gym.utils.env_checker import EnvCheckError, check_agent_env

    try:
        env = sao_gym.make(args.env_id)
    except Exception as e:  # noqa: BLE001 - the CLI reports any failure to build
        print(f"FAIL: cannot make {args.env_id}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    try:
        passed = check_agent_env(env)
    except EnvCheckError as e:
        print(f"FAIL: {args.env_id}\n{e}", file=sys.stderr)
        return 1
    for name in passed:
        print(f"ok   {name}")
    if args.episodes:
        rollouts = asyncio.run(run_episodes(
            lambda: sao_gym.make(args.env_id), lambda: RandomAgent(seed=args.seed),
            args.episodes, seed=args.seed,
        ))
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


def _cmd_demo(args: argparse.Namespace) -> int:
    from sao_gym.demo import run_demo

    summary = run_demo(Path(args.out), episodes=args.episodes, concurrency=args.concurrency)
    print(json.dumps(summary, indent=2))
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
    demo = sub.add_parser("demo", help="evaluate the tiny model on Arithmetic")
    demo.add_argument("--out", default="runs/demo", help="where the model is written")
    demo.add_argument("--episodes", type=int, default=16)
    demo.add_argument("--concurrency", type=int, default=16)
    demo.set_defaults(fn=_cmd_demo)
    sandbox = sub.add_parser("sandbox", help="sandbox maintenance")
    sandbox_sub = sandbox.add_subparsers(dest="sandbox_command", required=True)
    build = sandbox_sub.add_parser("build-image", help="build the DockerSandbox image offline "
                                   "(debootstrap + docker import; needs root and a daemon)")
    build.add_argument("--tag", default="sao-gym-sandbox:latest")
    build.add_argument("--extra-packages", default="", help="comma-separated Debian packages")
    build.add_argument("--rebuild", action="store_true", help="rebuild when the tag exists")
    build.set_defaults(fn=_cmd_sandbox_build_image)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``sao-gym`` console script."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
