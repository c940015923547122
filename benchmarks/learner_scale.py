"""The learner at scale, measured: full fine-tuning vs LoRA vs gradient checkpointing vs FSDP.

Run through ``benchmarks/learner.py --scale`` (rows in one run). Each row is
one learner (GRPO: the policy alone; synthetic multi-turn rollouts of
``tokens`` tokens, one micro-batch each) trained for ``steps`` learner steps
in fresh processes, so every rank's peak resident memory is its own:

- ``full``: one device, every parameter trained;
- ``lora``: one device, LoRA rank 8 on every linear layer of each decoder layer;
- ``ckpt``: ``full`` with gradient checkpointing;
- ``fsdp2``: ``full`` on 2 FSDP ranks (gloo; each rank trains half of the batch).

Per row (rank 0 of fsdp2; both ranks' peaks are printed): the median time of
the steps after the first, the peak resident memory above the process's
size before the learner was built (``VmHWM - VmRSS``, MB), the bytes of
parameters, gradients and AdamW state this rank holds (counted from its
tensors: DTensor shards under FSDP), the bytes a weight publish writes
(``model.safetensors``, or the LoRA adapter directory), the policy's
gradient norm of the first step, and the estimate of
:func:`sao_gym.learner.memory.learner_memory` for the same settings.
"""

from __future__ import annotations

import json
import os
import random
import socket
import statistics
import tempfile
import time
from pathlib import Path

ROWS = {
    "full": {},
    "lora": {"lora": 8},
    "ckpt": {"gradient_checkpointing": True},
    "fsdp2": {"ranks": 2},
}


def _status(field: str) -> int:
    """A ``/proc/self/status`` memory field in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def rollouts(n: int, tokens: int, seed: int = 0, vocab: int = 30000) -> list:
    """``n`` synthetic rollouts of ``tokens`` tokens (prompt, then actions and observations)
    of token ids below ``vocab``."""
    from sao_gym.types import Rollout, StopReason

    rng = random.Random(seed)
    out = []
    for i in range(n):
        ids, mask = [], []
        while len(ids) < tokens:
            seg = rng.randint(16, 96)
            ids += [rng.randrange(min(1000, vocab // 2), vocab) for _ in range(seg)]
            mask += [int(len(ids) > 64 and rng.random() < 0.6)] * seg
        ids, mask = ids[:tokens], mask[:tokens]
        mask[-1] = 1
        out.append(Rollout(ids, mask, [-2.0 * m for m in mask], [0 if m else -1 for m in mask],
                           float(i % 2), True, False, StopReason.TERMINATED, False, [],
                           "bench", f"t{i // 2}", None, {}))
    return out


def _tensor_bytes(t) -> int:
    local = t.to_local() if hasattr(t, "to_local") else t
    return local.numel() * local.element_size()


def _publish_bytes(weights: dict) -> int:
    from sao_gym.inference.weights import WeightsPublisher

    with tempfile.TemporaryDirectory() as tmp:
        path = WeightsPublisher(tmp).publish(weights, 1)
        return sum(f.stat().st_size for f in Path(path).iterdir())


def run_rank(rank: int, world: int, port: int, job: dict) -> None:
    """One learner process (rank ``rank`` of ``world``): train, measure, write ``job[out]``."""
    import torch
    import torch.distributed as dist

    from sao_gym.learner.config import LearnerConfig, LoraSettings
    from sao_gym.learner.learner import build_learner

    torch.set_num_threads(job["threads"])
    if world > 1:
        os.environ["LOCAL_RANK"] = str(rank)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world)
    try:
        from transformers import AutoConfig

        vocab = min(30000, AutoConfig.from_pretrained(job["model"]).vocab_size)
        batch = rollouts(job.get("rollouts", 2), job["tokens"], vocab=vocab)
        torch.ones(8) @ torch.ones(8)  # torch's own lazy start-up is not the learner's
        base = _status("VmRSS")
        config = LearnerConfig(
            lr=1e-5, critic_warmup_steps=0, max_tokens_per_microbatch=job["tokens"],
            engine="fsdp" if world > 1 else "local", ranks=world,
            lora=LoraSettings(rank=job["lora"]) if job.get("lora") else None,
            gradient_checkpointing=bool(job.get("gradient_checkpointing")))
        algorithm = job.get("algorithm", "grpo")
        learner = build_learner(algorithm, job["model"], config,
                                group_size=len(batch) if algorithm.startswith("grpo") else 1)
        if job.get("peak_of_training"):  # VmHWM from here on: loading's spikes are not counted
            import gc

            from sao_gym.learner.engine.host_memory import release_freed_memory

            gc.collect()
            release_freed_memory()  # what loading freed, glibc would otherwise keep resident
            Path("/proc/self/clear_refs").write_text("5")
        times, norms = [], []
        for _ in range(job["steps"]):
            t0 = time.perf_counter()
            metrics = learner.update(batch)
            times.append(time.perf_counter() - t0)
            norms.append(metrics["policy/grad_norm"])
        engine = learner.policy_engine
        params = sum(_tensor_bytes(p) for p in engine.module.parameters())
        grads = sum(_tensor_bytes(p) for p in engine.module.parameters() if p.requires_grad)
        optimizer = sum(_tensor_bytes(v) for s in engine.optimizer.state.values()
                        for v in s.values() if torch.is_tensor(v) and v.dim() > 0)
        peak = _status("VmHWM") - base
        weights = learner.weights()
        publish = _publish_bytes(weights) if rank == 0 else 0
        result = {"rank": rank, "step_s": statistics.median(times[1:] or times),
                  "peak_mb": peak / 2**20, "params": params, "grads": grads,
                  "optimizer": optimizer, "publish_bytes": publish, "grad_norm": norms[0],
                  "threads": torch.get_num_threads()}
        Path(f"{job['out']}.rank{rank}").write_text(json.dumps(result))
    finally:
        if world > 1:
            dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(name: str, model: str, tokens: int, steps: int, out_dir: Path,
            spec: dict | None = None) -> dict:
    """One row (``spec``, else ``ROWS[name]``), in fresh processes; rank 0's numbers plus
    every rank's peak."""
    import torch.multiprocessing as mp

    spec = ROWS[name] if spec is None else spec
    world = spec.get("ranks", 1)
    job = {"model": model, "tokens": tokens, "steps": steps, "out": str(out_dir / name),
           "threads": max(1, (os.cpu_count() or 1) // world), **spec}
    mp.start_processes(run_rank, args=(world, _free_port(), job), nprocs=world, join=True,
                       start_method="spawn")
    ranks = [json.loads(Path(f"{job['out']}.rank{r}").read_text()) for r in range(world)]
    return {**ranks[0], "peak_mb_ranks": [r["peak_mb"] for r in ranks], "ranks": world}


def estimate_mb(name: str, model: str, tokens: int, spec: dict | None = None) -> float:
    """:func:`~sao_gym.learner.memory.learner_memory` of the row's settings, in MB."""
    from transformers import AutoConfig

    from sao_gym.learner.memory import learner_memory

    spec = ROWS[name] if spec is None else spec
    est = learner_memory(AutoConfig.from_pretrained(model), ranks=spec.get("ranks", 1),
                         engine="fsdp" if spec.get("ranks", 1) > 1 else "local",
                         lora_rank=spec.get("lora"), critic=spec.get("algorithm") in ("sao",
                                                                                      "vapo"),
                         gradient_checkpointing=bool(spec.get("gradient_checkpointing")),
                         microbatch_tokens=tokens)
    return est.total / 2**20


def run(model: str, tokens: int, steps: int, rows: list[str]) -> dict:
    """Every row of ``rows``, one after the other; prints the table and the targets."""
    out_dir = Path(tempfile.mkdtemp(prefix="learner-scale-"))
    results = {}
    for name in rows:
        t0 = time.monotonic()
        results[name] = measure(name, model, tokens, steps, out_dir)
        results[name]["estimate_mb"] = estimate_mb(name, model, tokens)
        print(f"{name}: done in {time.monotonic() - t0:.0f} s", flush=True)
    mb = 2**20
    print(f"\n{tokens}-token micro-batches, 2 rollouts per step, {steps} steps per row")
    print(f"{'row':<7} {'step s':>7} {'peak MB':>9} {'est. MB':>8} {'est/peak':>8} "
          f"{'params MB':>9} {'grads MB':>8} {'optim MB':>8} {'publish MB':>10} "
          f"{'grad norm':>9}")
    for name, r in results.items():
        print(f"{name:<7} {r['step_s']:7.1f} {r['peak_mb']:9.0f} {r['estimate_mb']:8.0f} "
              f"{r['estimate_mb'] / r['peak_mb']:8.2f} {r['params'] / mb:9.0f} "
              f"{r['grads'] / mb:8.0f} {r['optimizer'] / mb:8.1f} "
              f"{r['publish_bytes'] / mb:10.2f} {r['grad_norm']:9.4f}"
              + (f"  (peaks per rank: {[round(p) for p in r['peak_mb_ranks']]})"
                 if r["ranks"] > 1 else ""))

    def state(r: dict) -> int:
        return r["params"] + r["grads"] + r["optimizer"]

    checks = {}
    if {"full", "fsdp2"} <= results.keys():
        checks["fsdp2 state per rank / full"] = state(results["fsdp2"]) / state(results["full"])
        checks["fsdp2 step time / full"] = results["fsdp2"]["step_s"] / results["full"]["step_s"]
    if {"full", "lora"} <= results.keys():
        checks["lora optimizer / full"] = (results["lora"]["optimizer"]
                                           / results["full"]["optimizer"])
        checks["publish full / lora bytes"] = (results["full"]["publish_bytes"]
                                               / results["lora"]["publish_bytes"])
    if {"full", "ckpt"} <= results.keys():
        checks["ckpt peak / full peak"] = results["ckpt"]["peak_mb"] / results["full"]["peak_mb"]
        checks["ckpt grad norm rel. diff"] = abs(
            results["ckpt"]["grad_norm"] / results["full"]["grad_norm"] - 1)
    for key, value in checks.items():
        print(f"{key}: {value:.3f}")
    worst = max(abs(r["estimate_mb"] / r["peak_mb"] - 1) for r in results.values())
    print(f"memory estimate: worst error {100 * worst:.1f}% over the rows")
    return {"rows": results, "checks": checks, "estimate_worst_error": worst}
