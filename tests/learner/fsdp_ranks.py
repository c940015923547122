"""A rank of the FSDP equality test: trains the same batch as the single-device learner.

Run by ``tests/learner/test_fsdp.py`` through ``torch.multiprocessing.spawn``:
``run(rank, world, port, job)`` with ``job`` a dict (policy path, algorithm,
learner config fields, rollouts pickle, steps, output path; optionally a
checkpoint directory to ``load`` the learner state from first and one to
``save`` it to after training).
"""

from __future__ import annotations

import os
import pickle
from dataclasses import replace


def run(rank: int, world: int, port: int, job: dict) -> None:
    import torch
    import torch.distributed as dist

    from sao_gym.learner.learner import build_learner

    torch.set_num_threads(1)
    os.environ["LOCAL_RANK"] = str(rank)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        config = replace(job["config"], engine="fsdp", ranks=world)
        learner = build_learner(job["algorithm"], job["policy"], config,
                                total_steps=job["steps"], group_size=job.get("group_size", 1))
        if job.get("load"):
            learner.load_state(job["load"])
        with open(job["rollouts"], "rb") as f:
            rollouts = pickle.load(f)
        trace = job.get("trace", ())
        metrics = [learner.update(rollouts, trace=trace) for _ in range(job["steps"])]
        assert sorted(learner.trace) == sorted(trace)  # every rank holds the whole trace
        if job.get("save"):
            learner.save_state(job["save"])
        policy = learner.policy_engine.weights()
        critic = learner.critic_engine.weights() if learner.critic_engine else None
        if rank == 0:
            torch.save({"policy": policy, "critic": critic, "metrics": metrics,
                        "version": learner.policy_version, "steps_done": learner.steps_done,
                        "trace": learner.trace,
                        "scores_tokens": learner.policy_engine.scores_tokens},
                       job["out"])
    finally:
        dist.destroy_process_group()
