"""``sao-gym plot`` and ``sao-gym view``: a run's curves as PNGs, runs in the browser."""

from __future__ import annotations

import argparse
import sys


def cmd_plot(args: argparse.Namespace) -> int:
    """``sao-gym plot``: PNG learning curves of one or more runs."""
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


def cmd_view(args: argparse.Namespace) -> int:
    """``sao-gym view``: serve runs' curves, episodes and tokens to the browser."""
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


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``plot`` and ``view`` to the subcommands of ``sao-gym``."""
    plot = sub.add_parser("plot", help="write PNG learning curves of one or more runs")
    plot.add_argument("run_dir", help="a run directory with metrics.jsonl")
    plot.add_argument("--compare", nargs="+", action="extend", default=[], metavar="RUN_DIR",
                      help="more runs drawn in the same figures")
    plot.add_argument("--out", default=None, help="output folder (default RUN_DIR/plots)")
    plot.add_argument("--smooth", type=float, default=0.9,
                      help="EMA weight in [0, 1) (default 0.9; 0: raw curves only)")
    plot.set_defaults(fn=cmd_plot)
    view = sub.add_parser("view", help="look at runs in the browser: curves, episodes, tokens")
    view.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories")
    view.add_argument("--host", default="127.0.0.1",
                      help="address to listen on (default 127.0.0.1, this machine only; any "
                           "other address serves the runs to whoever can reach it)")
    view.add_argument("--port", type=int, default=8765, help="port (default 8765)")
    view.set_defaults(fn=cmd_view)
