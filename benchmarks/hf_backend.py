"""HFBackend throughput: N concurrent requests (batched) vs the same requests one at a time.

Usage:
    .venv/bin/python benchmarks/hf_backend.py --requests 16 --new-tokens 64 --repeats 5 \
        --json docs/data/hf_backend_batching.json

Both modes run in the same process on the same backend, alternating in every
repeat, so machine noise hits both alike; the script reports each repeat,
the medians and their ratio. Every request samples (temperature 1, top-p 1)
exactly ``--new-tokens`` tokens (no stop tokens), from distinct prompts.
``--json PATH`` also writes every repeat, the medians, the decode steps by
batch size and how the script ran (``_record.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import tempfile
import time

import torch
from _record import write_record

from sao_gym.inference import HFBackend
from sao_gym.models import tiny_model
from sao_gym.types import SamplingParams


def make_prompts(n: int, length: int) -> list[list[int]]:
    return [[1] + [(31 * i + 7 * j) % 1000 + 3 for j in range(length - 1)] for i in range(n)]


async def run_concurrent(backend: HFBackend, prompts, params) -> float:
    start = time.perf_counter()
    gens = await asyncio.gather(*(backend.generate(p, params) for p in prompts))
    elapsed = time.perf_counter() - start
    return sum(len(g.token_ids) for g in gens) / elapsed


async def run_sequential(backend: HFBackend, prompts, params) -> float:
    start = time.perf_counter()
    n = 0
    for p in prompts:
        n += len((await backend.generate(p, params)).token_ids)
    return n / (time.perf_counter() - start)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--requests", type=int, default=16, help="concurrent requests")
    ap.add_argument("--new-tokens", type=int, default=64, help="tokens sampled per request")
    ap.add_argument("--prompt-tokens", type=int, default=32, help="prompt length")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--model", default=None, help="checkpoint dir (default: a fresh tiny_model)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--json", help="also write the raw results here")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)

    with tempfile.TemporaryDirectory() as tmp:
        path = args.model or tiny_model(os.path.join(tmp, "tiny"))
        backend = HFBackend(path, dtype=args.dtype, max_batch_size=max(32, args.requests), seed=0)
        prompts = make_prompts(args.requests, args.prompt_tokens)
        params = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0)
        await backend.generate(prompts[0], SamplingParams(max_new_tokens=8))  # warm-up
        print(
            f"model={args.model or 'tiny_model'} dtype={args.dtype} torch_threads="
            f"{torch.get_num_threads()} cpus={os.cpu_count()} requests={args.requests} "
            f"new_tokens={args.new_tokens} prompt_tokens={args.prompt_tokens}"
        )
        print(f"{'repeat':>6} {'batched tok/s':>14} {'sequential tok/s':>17} {'ratio':>6}")
        batched, sequential = [], []
        for r in range(args.repeats):
            batched.append(await run_concurrent(backend, prompts, params))
            sequential.append(await run_sequential(backend, prompts, params))
            print(
                f"{r:>6} {batched[-1]:>14.0f} {sequential[-1]:>17.0f} "
                f"{batched[-1] / sequential[-1]:>6.2f}"
            )
        sizes = backend.stats.batch_sizes
        await backend.aclose()
    mb, ms = statistics.median(batched), statistics.median(sequential)
    ratios = [b / s for b, s in zip(batched, sequential, strict=True)]
    print(f"median batched:    {mb:.0f} tok/s")
    print(f"median sequential: {ms:.0f} tok/s")
    print(
        f"ratio of medians:  {mb / ms:.2f}x   "
        f"(median of per-repeat ratios {statistics.median(ratios):.2f}x)"
    )
    print(f"decode steps by batch size: {dict(sorted(sizes.items()))}")
    if args.json:
        write_record(args.json, {
            "settings": {k: getattr(args, k) for k in ("requests", "new_tokens",
                                                       "prompt_tokens", "repeats", "dtype")}
            | {"model": args.model or "tiny_model"},
            "repeats": [{"batched_tok_s": b, "sequential_tok_s": s, "ratio": b / s}
                        for b, s in zip(batched, sequential, strict=True)],
            "median": {"batched_tok_s": mb, "sequential_tok_s": ms, "ratio_of_medians": mb / ms,
                       "median_of_ratios": statistics.median(ratios)},
            "decode_steps_by_batch_size": {str(k): v for k, v in sorted(sizes.items())}})


if __name__ == "__main__":
    asyncio.run(main())
