"""``sao-gym envs`` and ``sao-gym check``: the registered environments, and one's conformance."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

import sao_gym


def cmd_envs(args: argparse.Namespace) -> int:
    """``sao-gym envs``: the registered environment ids, one a line."""
    for env_id in sao_gym.env_ids():
        print(env_id)
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    """``sao-gym check ENV_ID``: the conformance checks, then random-agent episodes."""
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


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``envs`` and ``check`` to the subcommands of ``sao-gym``."""
    sub.add_parser("envs", help="list registered environments").set_defaults(fn=cmd_envs)
    check = sub.add_parser("check", help="check an environment's conformance")
    check.add_argument("env_id")
    check.add_argument("--episodes", type=int, default=10, help="random-agent episodes")
    check.add_argument("--seed", type=int, default=0)
    check.set_defaults(fn=cmd_check)
