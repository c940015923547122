"""Inference throughput and weight-sync time: HFBackend in-process, `sao-gym serve`, vLLM.

For each model (the demo's tiny model, and SmolLM2-135M-Instruct) and each
concurrency (1/16/64 requests at once, ``--tokens`` tokens each, no early
stop), it measures decode tokens/s of:

- ``hf``: :class:`HFBackend` in this process;
- ``sao``: a `sao-gym serve` server, through :class:`VLLMServerBackend`;
- ``vllm``: a `vllm serve` server (``--vllm-python``: an interpreter with
  vLLM, e.g. .venv-vllm/bin/python), through :class:`VLLMServerBackend`;
- ``bare``: for each server, the same streamed ``/v1/completions`` requests
  from a plain aiohttp loop that only parses the chunks: the floor any
  client pays. ``overhead`` = 1 - backend tok/s / bare tok/s.

Backend and bare runs alternate (ABBA) within the repeats, so the machine's drift
hits both: the overhead is the median of the paired ratios, and the client's
own CPU time per 1k tokens (the event-loop thread, both ways) beside it.
Weight sync: ``update_weights`` of the model's own state dict, with nothing
in flight, median of ``--repeats``:
in-process copy (hf), and for servers the whole path (write safetensors +
pause/reload/version/resume) and its publish part alone.

Run: .venv/bin/python benchmarks/inference.py --vllm-python .venv-vllm/bin/python \
        --out docs/data/inference.json

``--out`` writes every run (tokens/s of each repeat, each weight sync's time)
beside the medians, and how the script ran (``_record.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp
from _record import write_record

from sao_gym.inference.launch import LocalServers
from sao_gym.inference.vllm_server import VLLMServerBackend, completion_body
from sao_gym.inference.weights import WeightsPublisher, load_weights_dir
from sao_gym.types import SamplingParams


def prompts(n: int, vocab: int) -> list[list[int]]:
    return [[(97 * i + 13 * j) % (vocab - 10) + 5 for j in range(16 + i % 8)] for i in range(n)]


def params(tokens: int, i: int) -> SamplingParams:
    return SamplingParams(tokens, 1.0, 1.0, (), seed=1000 + i)


def _rates(n: int, t: float, cpu: float) -> tuple[float, float]:
    """(tokens/s, the event-loop thread's CPU ms per 1k tokens) of a run of ``n`` tokens."""
    return n / (time.perf_counter() - t), 1e6 * (time.thread_time() - cpu) / max(n, 1)


async def backend_run(backend, ps: list[list[int]], tokens: int) -> tuple[float, float]:
    t, cpu = time.perf_counter(), time.thread_time()
    gens = await asyncio.gather(*(backend.generate(p, params(tokens, i))
                                  for i, p in enumerate(ps)))
    return _rates(sum(len(g.token_ids) for g in gens), t, cpu)


async def bare_run(url: str, ps: list[list[int]], tokens: int) -> tuple[float, float]:
    async def one(http: aiohttp.ClientSession, i: int, p: list[int]) -> int:
        body = completion_body("policy", p, params(tokens, i), tokens)
        ids, lps = [], []
        async with http.post(url + "/v1/completions", json=body) as resp:
            async for raw in resp.content:
                if raw.startswith(b"data:") and not raw.startswith(b"data: [DONE]"):
                    c = json.loads(raw[5:])["choices"][0]
                    ids += c["token_ids"]
                    lps += c["logprobs"]["token_logprobs"]
        return len(ids)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        t, cpu = time.perf_counter(), time.thread_time()
        n = sum(await asyncio.gather(*(one(http, i, p) for i, p in enumerate(ps))))
        return _rates(n, t, cpu)


async def time_update(backend, weights, repeats: int) -> list[float]:
    """Seconds of each of ``repeats`` weight updates."""
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        await backend.update_weights(weights, backend.policy_version + 1)
        times.append(time.perf_counter() - t)
    return times


async def bench_hf(path: str, conc: list[int], tokens: int, repeats: int, vocab: int) -> dict:
    from sao_gym.inference.hf.backend import HFBackend

    backend = HFBackend(path, max_batch_size=max(conc), seed=0)
    try:
        await backend_run(backend, prompts(2, vocab), 4)  # warm-up
        out = {}
        for c in conc:
            runs = [(await backend_run(backend, prompts(c, vocab), tokens))[0]
                    for _ in range(repeats)]
            out[str(c)] = {"hf": statistics.median(runs), "hf_runs": runs}
        weights = {k: v.clone() for k, v in backend.model.state_dict().items()}
        out["update_runs"] = await time_update(backend, weights, repeats)
        out["update_s"] = statistics.median(out["update_runs"])
        return out
    finally:
        await backend.aclose()


async def bench_server(urls: list[str], path: str, conc: list[int], tokens: int, repeats: int,
                       vocab: int, work: Path) -> dict:
    backend = VLLMServerBackend(urls, sync_dir=work / "sync")
    try:
        await backend.start()
        await backend_run(backend, prompts(2, vocab), 4)
        await bare_run(urls[0], prompts(2, vocab), 4)
        out = {}
        for c in conc:
            ps, ours, bare = prompts(c, vocab), [], []
            for i in range(repeats):  # ABBA order: neither side always runs first
                if i % 2:
                    bare.append(await bare_run(urls[0], ps, tokens))
                ours.append(await backend_run(backend, ps, tokens))
                if not i % 2:
                    bare.append(await bare_run(urls[0], ps, tokens))
            med = statistics.median
            out[str(c)] = {
                "backend": med(o for o, _ in ours), "bare": med(b for b, _ in bare),
                # paired: each backend run against the bare run next to it
                "overhead": med(1 - o / b for (o, _), (b, _) in zip(ours, bare, strict=True)),
                "client_cpu_ms_per_1k": {"backend": med(c for _, c in ours),
                                         "bare": med(c for _, c in bare)},
                "backend_runs": [o for o, _ in ours], "bare_runs": [b for b, _ in bare],
                "client_cpu_ms_per_1k_runs": {"backend": [c for _, c in ours],
                                              "bare": [c for _, c in bare]}}
        weights = load_weights_dir(path)
        publisher = WeightsPublisher(work / "pub")
        pub = []
        for v in range(repeats):
            t = time.perf_counter()
            publisher.publish(weights, v)
            pub.append(time.perf_counter() - t)
        out["publish_s"], out["publish_runs"] = statistics.median(pub), pub
        out["update_runs"] = await time_update(backend, weights, repeats)
        out["update_s"] = statistics.median(out["update_runs"])
        return out
    finally:
        await backend.aclose()


def model_info(path: str) -> dict:
    from safetensors import safe_open

    n, nbytes = 0, 0
    for f in Path(path).glob("*.safetensors"):
        with safe_open(str(f), "pt") as st:
            for k in st.keys():  # noqa: SIM118 - safe_open has no __iter__
                t = st.get_slice(k)
                size = 1
                for d in t.get_shape():
                    size *= d
                n += size
                nbytes += size * 4
    return {"params": n, "fp32_mb": nbytes / 2**20}


def resolve(name: str, work: Path) -> str:
    """A checkpoint of ``name``; ``tiny`` is the demo's (its recipe's ``model_options``)."""
    from sao_gym.models import resolve_model
    from sao_gym.runtime.config.loader import load_recipe

    options = load_recipe("demo").model_options if name == "tiny" else None
    return resolve_model(name, work / name, 0, options=options)


async def main_async(args: argparse.Namespace) -> dict:
    conc = [int(c) for c in args.concurrency.split(",")]
    results: dict = {"tokens": args.tokens, "repeats": args.repeats, "concurrency": conc,
                     "models": {}}
    work = Path(tempfile.mkdtemp(prefix="bench-inference-"))
    for name in args.models.split(","):
        path = resolve(name, work)
        from transformers import AutoConfig

        vocab = AutoConfig.from_pretrained(path).vocab_size
        res = {"path": path, **model_info(path)}
        print(f"== {name}: {res['params'] / 1e6:.1f}M params ({res['fp32_mb']:.0f} MB fp32)",
              flush=True)
        if "hf" in args.kinds:
            res["hf"] = await bench_hf(path, conc, args.tokens, args.repeats, vocab)
            print("hf", json.dumps(res["hf"]), flush=True)
        for kind in ("sao", "vllm"):
            if kind not in args.kinds or (kind == "vllm" and not args.vllm_python):
                continue
            servers = LocalServers(path, 1, kind=kind, python=args.vllm_python
                                   if kind == "vllm" else None, log_dir=work / f"{name}-{kind}",
                                   max_model_len=args.max_model_len,
                                   max_batch_size=max(conc))
            t = time.perf_counter()
            with servers:
                start_s = time.perf_counter() - t
                res[kind] = await bench_server(servers.urls, path, conc, args.tokens,
                                               args.repeats, vocab, work / f"{name}-{kind}")
            res[kind]["startup_s"] = start_s
            print(kind, json.dumps({k: v for k, v in res[kind].items()}), flush=True)
        results["models"][name] = res
    return results


def report(results: dict) -> None:
    print("\nmodel      conc   hf tok/s   sao tok/s (bare, overhead)   vllm tok/s (bare, overhead)"
          "   [client CPU ms/1k tokens: backend vs bare]")
    for name, res in results["models"].items():
        for c in [k for k in res.get("hf", res.get("sao", {})) if k.isdigit()]:
            row = f"{name:10s} {c:>4s}"
            row += f"   {res['hf'][c]['hf']:8.0f}" if "hf" in res else "        -"
            for kind in ("sao", "vllm"):
                if kind in res:
                    r = res[kind][c]
                    pct = 100 * r["overhead"]
                    row += f"   {r['backend']:8.0f} ({r['bare']:6.0f}, {pct:+5.1f}%)"
            cpu = [f"{k} {res[k][c]['client_cpu_ms_per_1k']['backend']:.0f} vs "
                   f"{res[k][c]['client_cpu_ms_per_1k']['bare']:.0f}"
                   for k in ("sao", "vllm") if k in res]
            print(row + ("   [" + ", ".join(cpu) + "]" if cpu else ""))
        for kind in ("hf", "sao", "vllm"):
            if kind in res:
                pub = res[kind].get("publish_s")
                extra = f" (publish {pub * 1e3:.0f} ms)" if pub is not None else ""
                print(f"{name:10s} weight sync {kind}: {res[kind]['update_s'] * 1e3:.0f} ms{extra}"
                      f" for {res['fp32_mb']:.0f} MB")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="tiny,smollm2")
    p.add_argument("--kinds", default="hf,sao,vllm")
    p.add_argument("--concurrency", default="1,16,64")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--vllm-python", default=None, help="an interpreter with vLLM")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    results = asyncio.run(main_async(args))
    report(results)
    if args.out:
        write_record(args.out, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
