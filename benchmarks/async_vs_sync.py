"""Training throughput of async (SAO) vs sync mode on heavy-tailed episodes.

Same as `sao-gym bench async-vs-sync` (same runs, same output); see
sao_gym/runtime/bench.py. With ``--json PATH`` it also writes every run's
trajectories/s, the medians, the ratio, the benchmark's config and how the
script ran (``_record.py``).

Run: .venv/bin/python benchmarks/async_vs_sync.py --repeats 3 \
        --json docs/data/async_vs_sync.json
     .venv/bin/python benchmarks/async_vs_sync.py --set env_kwargs={latency_sigma: 0.0}
"""

import argparse

from _record import write_record

from sao_gym.cli.bench import print_async_vs_sync
from sao_gym.runtime.bench import async_vs_sync


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override the benchmark's train config (see sao_gym.runtime.bench)")
    p.add_argument("--repeats", type=int, default=1, help="alternating runs per mode")
    p.add_argument("--json", help="also write the raw results here")
    args = p.parse_args()
    result = async_vs_sync(args.set, repeats=args.repeats)
    print_async_vs_sync(result)
    if args.json:
        write_record(args.json, {"overrides": args.set, "repeats": args.repeats, **result})


if __name__ == "__main__":
    main()
