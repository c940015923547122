"""One-command device check: decode, sampler/learner agreement, learner and weight-update speed.

Run: .venv/bin/python benchmarks/gpu_check.py [--device cuda|cpu] [--out F.json] [--size S]

Builds a RANDOM Qwen2 model (nothing is downloaded): ``0.5b`` has Qwen2.5-0.5B's
shape (bf16 on cuda), ``tiny`` is :func:`sao_gym.models.tiny_model` (the cpu default).
Prints one line per measurement; ``--out`` also writes every number as JSON:

1. ``hf_decode``: HFBackend tokens/s with 1, 8 and 64 concurrent requests
   (128 new tokens each on cuda, 16 on cpu; temperature 1, no stop tokens);
2. ``logprob_agreement``: the sampler's recorded logprobs of the concurrency-8
   generations against a fresh full forward pass of the same checkpoint in the
   backend's dtype; ``learner_logprob_agreement``: the same against the learner
   in its training configuration (fp32 weights, bf16 autocast on cuda). A random
   model's distributions are nearly uniform: a trained model's mismatch can be larger;
3. ``learner``: SAO learner tokens/s (critic included) on synthetic rollouts
   (16 x 512 tokens on cuda, 4 x 64 on cpu; half of them action tokens);
4. ``weight_update``: seconds ``HFBackend.update_weights`` takes while 8
   generations run (median of 3), and whether they saw both versions;
5. ``learner_scale``: the same SAO learner and rollouts as 3, per row: full
   fine-tuning (bf16 autocast on cuda), LoRA rank 8, gradient checkpointing,
   FSDP2 on one rank (NCCL on cuda, gloo on cpu; bf16 through FSDP's
   ``MixedPrecisionPolicy``), and on cuda FSDP2 with ``cpu_offload``: median
   step seconds, peak GPU memory (cuda), trainable parameters and AdamW state
   bytes, the first step's policy gradient norm; checks that every row trains
   (finite, weights moved), that LoRA's AdamW state is under 1/20 of full's,
   and that checkpointing and FSDP give full's gradient norm (within 1e-3
   relative in fp32, 5e-2 in bf16);
6. ``vllm``: decode tokens/s with VLLMBackend when vLLM imports (cuda only).
Exits 2 without a GPU under ``--device cuda``, 1 when a measurement failed.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import transformers

from sao_gym.inference.hf.backend import HFBackend
from sao_gym.learner.batching import micro_batches, token_logprobs
from sao_gym.learner.learner import Learner, LearnerConfig, build_learner
from sao_gym.models import load_policy, tiny_model
from sao_gym.types import Generation, Rollout, SamplingParams, StopReason

QWEN25_05B = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, intermediate_size=4864, vocab_size=151936,
                  tie_word_embeddings=True, max_position_embeddings=32768, rope_theta=1e6,
                  use_sliding_window=False)
CONCURRENCY = (1, 8, 64)
PROMPT_TOKENS = 16


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def build_model(size: str, device: str, root: Path) -> str:
    """A random checkpoint directory (weights, config and a tokenizer)."""
    if size == "tiny":
        return tiny_model(root / "tiny")
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    # load_policy (HFBackend, learner) reads a tokenizer too: borrow tiny_model's
    tok = AutoTokenizer.from_pretrained(tiny_model(root / "tok", hidden_size=64, num_layers=1))
    path = root / "qwen2.5-0.5b-random"
    config = Qwen2Config(**QWEN25_05B, bos_token_id=None, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    model.to(torch.bfloat16 if device == "cuda" else torch.float32).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def make_prompts(n: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(PROMPT_TOKENS)] for _ in range(n)]


def make_rollout(ids: list[int], mask: list[int], logprobs: list[float], versions: list[int],
                 i: int) -> Rollout:
    return Rollout(token_ids=ids, loss_mask=mask, rollout_logprobs=logprobs,
                   policy_versions=versions, reward=float(i % 2), terminated=True,
                   truncated=False, stop_reason=StopReason.TERMINATED, infra_failure=False,
                   messages=[], env_id="bench/gpu-check", task_id=f"t{i}", seed=None)


def synthetic_rollouts(n: int, length: int, vocab: int) -> list[Rollout]:
    """A prompt span, then alternating action/observation spans: half the tokens are actions."""
    rng, span = random.Random(0), max(1, length // 8)
    out = []
    for i in range(n):
        mask = [(t // span) % 2 for t in range(length)]
        out.append(make_rollout([rng.randrange(vocab) for _ in range(length)], mask,
                                [-11.0 * m for m in mask], [0 if m else -1 for m in mask], i))
    return out


async def timed_generate(backend: Any, prompts: list[list[int]], new_tokens: int,
                         device: str) -> tuple[float, list[Generation]]:
    sync(device)
    t0 = time.perf_counter()
    gens = await asyncio.gather(*(backend.generate(p, SamplingParams(
        max_new_tokens=new_tokens, temperature=1.0, seed=i)) for i, p in enumerate(prompts)))
    sync(device)
    return time.perf_counter() - t0, list(gens)


async def decode_suite(backend: Any, name: str, new_tokens: int, vocab: int,
                       device: str) -> tuple[dict[str, Any], list[list[int]], list[Generation]]:
    """Tokens/s at each concurrency; also returns the concurrency-8 prompts and generations."""
    await timed_generate(backend, make_prompts(8, vocab, seed=99), 8, device)  # warm-up
    out, keep = {}, ([], [])
    for n in CONCURRENCY:
        prompts = make_prompts(n, vocab, seed=n)
        seconds, gens = await timed_generate(backend, prompts, new_tokens, device)
        tokens = sum(len(g.token_ids) for g in gens)
        out[str(n)] = {"requests": n, "tokens": tokens, "seconds": seconds,
                       "tokens_per_s": tokens / seconds}
        print(f"{name} decode, concurrency {n:>2}: {tokens / seconds:9.1f} tokens/s "
              f"({tokens} tokens in {seconds:.2f} s)", flush=True)
        if n == 8:
            keep = (prompts, gens)
    return out, *keep


def diff_stats(name: str, diff: torch.Tensor) -> dict[str, Any]:
    """``diff`` = learner minus sampler logprob per token; the importance ratio is exp(diff)."""
    ratio = diff.exp()
    out = {"tokens": diff.numel(), "max_abs_diff": float(diff.abs().max()),
           "mean_abs_diff": float(diff.abs().mean()),
           "mean_abs_ratio_minus_1": float((ratio - 1).abs().mean()),
           "share_ratio_outside_0.8_1.2": float(((ratio < 0.8) | (ratio > 1.2)).double().mean())}
    print(f"{name}: max |diff| {out['max_abs_diff']:.2e}, mean {out['mean_abs_diff']:.2e}, "
          f"mean |ratio-1| {out['mean_abs_ratio_minus_1']:.2e}, outside [0.8, 1.2] "
          f"{out['share_ratio_outside_0.8_1.2']:.2%} of {out['tokens']} tokens", flush=True)
    return out


@torch.no_grad()
def logprob_agreement(path: str, device: str, dtype: str, prompts: list[list[int]],
                      gens: list[Generation]) -> dict[str, Any]:
    """Sampler logprobs against one fresh full forward pass (logits t predict token t + 1)."""
    model, _ = load_policy(path, device=device, dtype=dtype)
    diffs = []
    for p, g in zip(prompts, gens, strict=True):
        ids = torch.tensor([p + g.token_ids], device=device)
        lp = token_logprobs(model(input_ids=ids).logits, ids, 1.0)[0, len(p):]
        diffs.append(lp.double().cpu() - torch.tensor(g.logprobs, dtype=torch.float64))
    del model
    return {"dtype": dtype, **diff_stats(f"sampler vs forward ({dtype})", torch.cat(diffs))}


@torch.no_grad()
def learner_agreement(learner: Learner, prompts: list[list[int]],
                      gens: list[Generation]) -> dict[str, Any]:
    """Sampler logprobs against the learner's own scoring (its dtype and autocast)."""
    rollouts = [make_rollout(p + g.token_ids, [0] * len(p) + [1] * len(g.token_ids),
                             [0.0] * len(p) + g.logprobs, [-1] * len(p) + g.policy_versions, i)
                for i, (p, g) in enumerate(zip(prompts, gens, strict=True))]
    diffs = []
    for mb in micro_batches(rollouts, 1 << 16, learner.pad_id):
        mb = learner.policy_engine.to_device(mb)
        with torch.no_grad():
            lp = learner.score(mb)[0].double()
        diffs.append((lp - mb.rollout_logprobs_BT.double())[mb.action_mask_BT > 0].cpu())
    cfg = learner.config
    name = f"sampler vs learner ({cfg.dtype}, autocast {cfg.autocast})"
    return {"dtype": cfg.dtype, "autocast": cfg.autocast, **diff_stats(name, torch.cat(diffs))}


def learner_throughput(learner: Learner, rollouts: list[Rollout], steps: int) -> dict:
    device = learner.config.device
    tokens = sum(len(r.token_ids) for r in rollouts)
    learner.update(rollouts)  # warm-up
    times = []
    for _ in range(steps):
        sync(device)
        t0 = time.perf_counter()
        learner.update(rollouts)
        sync(device)
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    out = {"algorithm": learner.algorithm, "device": str(next(learner.policy.parameters()).device),
           "dtype": learner.config.dtype, "autocast": learner.config.autocast,
           "rollouts": len(rollouts), "tokens_per_step": tokens,
           "action_tokens_per_step": sum(r.num_action_tokens for r in rollouts),
           "step_seconds": times, "tokens_per_s": tokens / med,
           "policy_version": learner.policy_version, "skipped_steps": learner.skipped_steps}
    print(f"learner ({out['algorithm']}, {out['device']}): {tokens / med:9.1f} tokens/s "
          f"({len(rollouts)} rollouts, {tokens} tokens, median step {med:.2f} s)", flush=True)
    return out


SCALE_ROWS = {
    "full": {},
    "lora": {"lora": 8},
    "ckpt": {"gradient_checkpointing": True},
    "fsdp1": {"engine": "fsdp"},
    "fsdp1_offload": {"engine": "fsdp", "cpu_offload": True, "cuda_only": True},
}


def _one_rank_group(device: str) -> None:
    """A process group of this process alone, for the FSDP row."""
    import os
    import socket

    import torch.distributed as dist

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    if device == "cuda":  # rank_device reads it; on the CPU it would only leak to children
        os.environ["LOCAL_RANK"] = "0"
    dist.init_process_group("nccl" if device == "cuda" else "gloo",
                            init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)


def scale_row(name: str, path: str, device: str, rollouts: list[Rollout], steps: int) -> dict:
    """One learner configuration of ``SCALE_ROWS`` trained ``1 + steps`` steps; its numbers."""
    import os

    import torch.distributed as dist

    from sao_gym.learner.config import LoraSettings

    spec, cuda = SCALE_ROWS[name], device == "cuda"
    if spec.get("engine") == "fsdp":
        _one_rank_group(device)
    try:
        cfg = LearnerConfig(device=device, dtype="float32", critic_warmup_steps=0,
                            autocast="bfloat16" if cuda else None,
                            engine=spec.get("engine", "local"),
                            lora=LoraSettings(rank=spec["lora"]) if "lora" in spec else None,
                            gradient_checkpointing=spec.get("gradient_checkpointing", False),
                            cpu_offload=spec.get("cpu_offload", False))
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        learner = build_learner("sao", path, cfg, total_steps=10, temperature=1.0)
        engine = learner.policy_engine
        before = {n: p.detach().float().clone() for n, p in engine.module.named_parameters()
                  if p.requires_grad}
        norms, times = [], []
        for _ in range(1 + steps):
            sync(device)
            t0 = time.perf_counter()
            metrics = learner.update(rollouts)
            sync(device)
            times.append(time.perf_counter() - t0)
            norms.append(metrics["policy/grad_norm"])
        moved = max(float((p.detach().float() - before[n]).abs().max())
                    for n, p in engine.module.named_parameters() if p.requires_grad)
        local = [p.to_local() if hasattr(p, "to_local") else p
                 for p in engine.module.parameters()]
        out = {"step_seconds": statistics.median(times[1:]), "grad_norm": norms[0],
               "weights_moved": moved, "finite": all(math.isfinite(x) for x in norms),
               "trainable": sum(p.numel() for p in engine.module.parameters()
                                if p.requires_grad),
               "optimizer_bytes": sum(v.numel() * v.element_size()
                                      for st in engine.optimizer.state.values()
                                      for v in st.values() if torch.is_tensor(v) and v.dim()),
               "parameter_bytes": sum(p.numel() * p.element_size() for p in local)}
        if cuda:
            out["peak_gpu_memory_gb"] = torch.cuda.max_memory_allocated() / 2**30
        del learner, engine
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
        return out
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        os.environ.pop("LOCAL_RANK", None)


def own_logprobs(path: str, rollouts: list[Rollout]) -> list[Rollout]:
    """``rollouts`` with the checkpoint's own logprobs as the sampler's (ratios start at 1)."""
    import dataclasses

    model = load_policy(path, device="cpu")[0].eval()
    out = []
    with torch.no_grad():
        for r in rollouts:
            ids = torch.tensor([r.token_ids])
            lp = token_logprobs(model(input_ids=ids).logits.float(), ids)[0].tolist()
            out.append(dataclasses.replace(r, rollout_logprobs=[
                x if m else 0.0 for x, m in zip(lp, r.loss_mask, strict=True)]))
    return out


def learner_scale(path: str, device: str, rollouts: list[Rollout], steps: int) -> dict:
    """Every row of ``SCALE_ROWS`` and the checks between them (docstring item 5)."""
    rollouts = own_logprobs(path, rollouts)
    rows = {name: scale_row(name, path, device, rollouts, steps)
            for name, spec in SCALE_ROWS.items() if device == "cuda" or not spec.get("cuda_only")}
    full, tol = rows["full"], 5e-2 if device == "cuda" else 1e-3
    checks = {
        "every row trains": all(r["finite"] and r["weights_moved"] > 0 for r in rows.values()),
        "lora optimizer <= 1/20 of full": rows["lora"]["optimizer_bytes"] * 20
        <= full["optimizer_bytes"],
        **{f"{n} grad norm = full's": abs(rows[n]["grad_norm"] / full["grad_norm"] - 1) <= tol
           for n in ("ckpt", "fsdp1", "fsdp1_offload") if n in rows},
    }
    for name, r in rows.items():
        mem = (f", peak {r['peak_gpu_memory_gb']:.2f} GB" if "peak_gpu_memory_gb" in r else "")
        print(f"learner {name:<5}: step {r['step_seconds']:.3f} s{mem}, trainable "
              f"{r['trainable'] / 1e6:.2f} M, AdamW state {r['optimizer_bytes'] / 2**20:.1f} MB, "
              f"grad norm {r['grad_norm']:.4f}", flush=True)
    for check, ok in checks.items():
        print(f"learner_scale check: {check}: {'ok' if ok else 'FAILED'}", flush=True)
    return {"rows": rows, "checks": checks}


async def update_latency(backend: HFBackend, vocab: int, new_tokens: int, device: str,
                         rounds: int = 3) -> dict[str, Any]:
    """Time ``update_weights`` landing while 8 generations are two decode steps in."""
    state = {k: v.detach().clone() for k, v in backend.model.state_dict().items()}
    per_round = []
    for r in range(rounds):
        before, prompts = backend.policy_version, make_prompts(8, vocab, seed=100 + r)
        tasks = [asyncio.ensure_future(backend.generate(p, SamplingParams(
            max_new_tokens=new_tokens, temperature=1.0, seed=i))) for i, p in enumerate(prompts)]
        start = backend.stats.tokens_generated
        while (backend.stats.tokens_generated < start + 2 * len(prompts)
               and not all(t.done() for t in tasks)):
            await asyncio.sleep(0.001)
        sync(device)
        t0 = time.perf_counter()
        await backend.update_weights(state, before + 1)
        sync(device)
        seconds = time.perf_counter() - t0
        gens = await asyncio.gather(*tasks)
        per_round.append({"seconds": seconds, "from_version": before, "to_version": before + 1,
                          "versions_seen": sorted({v for g in gens for v in g.policy_versions}),
                          "generations_with_both": sum({before, before + 1} <= set(
                              g.policy_versions) for g in gens)})
    med = statistics.median(x["seconds"] for x in per_round)
    mid = all(x["generations_with_both"] == 8 for x in per_round)
    print(f"weight update during 8 generations: median {med * 1e3:.1f} ms over {rounds}; "
          f"every generation saw old and new versions: {mid}", flush=True)
    return {"median_seconds": med, "landed_mid_generation": mid, "rounds": per_round,
            "tensors": len(state), "bytes": sum(v.numel() * v.element_size()
                                                for v in state.values())}


async def vllm_decode(path: str, device: str, dtype: str, new_tokens: int, vocab: int) -> Any:
    try:
        import vllm
    except ImportError:
        print("vllm: not installed", flush=True)
        return "not installed"
    if device != "cuda":
        print("vllm: skipped (cpu run)", flush=True)
        return "skipped on cpu"
    from sao_gym.inference.vllm import VLLMBackend

    backend = VLLMBackend(path, dtype=dtype, max_model_len=1024, seed=0,
                          gpu_memory_utilization=0.5)
    try:
        decode, _, _ = await decode_suite(backend, "vllm", new_tokens, vocab, device)
        return {"version": vllm.__version__, "decode": decode}
    finally:
        await backend.aclose()


async def run_all(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    cuda = args.device == "cuda"
    dtype, new_tokens = ("bfloat16", 128) if cuda else ("float32", 16)
    res: dict[str, Any] = {
        "device": args.device, "torch": torch.__version__, "size": args.size, "dtype": dtype,
        "new_tokens": new_tokens, "prompt_tokens": PROMPT_TOKENS, "errors": {},
        "device_name": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu"}
    print(f"device {res['device_name']}, torch {torch.__version__}", flush=True)
    t0 = time.perf_counter()
    path = build_model(args.size, args.device, root)
    vocab = json.loads((Path(path) / "config.json").read_text())["vocab_size"]
    print(f"random Qwen2 {args.size} (vocab {vocab}) built in {time.perf_counter() - t0:.1f} s",
          flush=True)
    backend = HFBackend(path, device=args.device, dtype=dtype, max_batch_size=64, seed=0)
    res["params"] = sum(p.numel() for p in backend.model.parameters())
    try:
        res["hf_decode"], prompts, gens = await decode_suite(backend, "hf", new_tokens, vocab,
                                                             args.device)
        res["logprob_agreement"] = logprob_agreement(path, args.device, dtype, prompts, gens)
        cfg = LearnerConfig(device=args.device, dtype="float32", critic_warmup_steps=0,
                            autocast="bfloat16" if cuda else None)
        learner = build_learner("sao", path, cfg, total_steps=10, temperature=1.0)
        res["learner_logprob_agreement"] = learner_agreement(learner, prompts, gens)
        n, length = (16, 512) if cuda else (4, 64)
        res["learner"] = learner_throughput(learner, synthetic_rollouts(n, length, vocab),
                                            steps=3 if cuda else 2)
        del learner
        res["learner_scale"] = learner_scale(path, args.device,
                                             synthetic_rollouts(n, length, vocab),
                                             steps=2 if cuda else 1)
        if not all(res["learner_scale"]["checks"].values()):
            res["errors"]["learner_scale"] = [c for c, ok in
                                              res["learner_scale"]["checks"].items() if not ok]
        res["weight_update"] = await update_latency(backend, vocab, new_tokens, args.device)
    finally:
        await backend.aclose()
    del backend
    gc.collect()
    if cuda:
        res["peak_gpu_memory_gb"] = torch.cuda.max_memory_allocated() / 2**30
        torch.cuda.empty_cache()
    try:
        res["vllm"] = await vllm_decode(path, args.device, dtype, new_tokens, vocab)
    except Exception as e:  # record it: the HF numbers above still stand
        print(f"vllm: FAILED {e!r}", flush=True)
        res["vllm"], res["errors"]["vllm"] = "failed", repr(e)
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--out", help="write every number as JSON to this file")
    ap.add_argument("--size", choices=("0.5b", "tiny"),
                    help="model shape (default: 0.5b on cuda, tiny on cpu)")
    args = ap.parse_args(argv)
    args.size = args.size or ("0.5b" if args.device == "cuda" else "tiny")
    transformers.utils.logging.disable_progress_bar()
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"gpu_check: --device cuda, but torch {torch.__version__} sees no CUDA GPU "
              "(run with --device cpu for the CPU check)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        res = asyncio.run(run_all(args, Path(tmp)))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 1 if res["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
