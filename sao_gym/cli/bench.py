"""``sao-gym bench``: the benchmarks that ship with the package."""

from __future__ import annotations

import argparse
import json
import sys


def cmd_bench_async_vs_sync(args: argparse.Namespace) -> int:
    """``sao-gym bench async-vs-sync``: trajectories/s of both modes, alternating."""
    from sao_gym.runtime.bench import async_vs_sync
    from sao_gym.runtime.config.schema import ConfigError

    try:
        result = async_vs_sync(args.set, repeats=args.repeats)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print_async_vs_sync(result)
    return 0


def print_async_vs_sync(result: dict) -> None:
    """Print :func:`~sao_gym.runtime.bench.async_vs_sync`'s result.

    Each mode's runs and median, the ratio, and a JSON line of the three.
    """
    for mode in ("async", "sync"):
        runs = ", ".join(f"{x:.2f}" for x in result["runs"][mode])
        print(f"{mode:>5}: {result[f'{mode}_trajectories_per_s']:.2f} trajectories/s "
              f"(median of {runs})")
    print(f"ratio: {result['ratio']:.2f}x async/sync, {result['trajectories']} trajectories each")
    keys = ("async_trajectories_per_s", "sync_trajectories_per_s", "ratio")
    print(json.dumps({k: round(result[k], 4) for k in keys}))


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``bench`` to the subcommands of ``sao-gym``."""
    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    avs = bench_sub.add_parser("async-vs-sync", help="training throughput, async vs sync mode")
    avs.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="override the benchmark's train config (see sao_gym.runtime.bench)")
    avs.add_argument("--repeats", type=int, default=1, help="alternating runs per mode")
    avs.set_defaults(fn=cmd_bench_async_vs_sync)
