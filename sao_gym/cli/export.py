"""``sao-gym export``: tasks (Harbor task directories) and trajectories (ATIF) for other tools."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sao_gym.adapters.harbor import add_export_parser


def cmd_export_atif(args: argparse.Namespace) -> int:
    """``sao-gym export atif``: a run's kept rollouts as ATIF trajectories."""
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


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``export`` to the subcommands of ``sao-gym``."""
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
    atif.set_defaults(fn=cmd_export_atif)
