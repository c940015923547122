"""Training throughput of async (SAO) vs sync mode on heavy-tailed episodes.

Same as `sao-gym bench async-vs-sync`; see sao_gym/runtime/bench.py.

Run: .venv/bin/python benchmarks/async_vs_sync.py --repeats 3
     .venv/bin/python benchmarks/async_vs_sync.py --set env_kwargs={latency_sigma: 0.0}
"""

import sys

from sao_gym.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "async-vs-sync", *sys.argv[1:]]))
