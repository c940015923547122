"""The embedded default job (``make demo``): the tiny model on Arithmetic.

Builds the tiny random model (no network), serves it with the in-process
:class:`~sao_gym.inference.hf.HFBackend`, and plays seeded Arithmetic
episodes concurrently with :class:`~sao_gym.agents.LLMAgent`, showing
progress. The model is untrained, so its success rate is near zero: this
exercises the whole stack (template, sampling, tool parsing, env) end to end.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

import sao_gym
from sao_gym.evaluation import EpisodeSummary, run_episodes
from sao_gym.types import Rollout

ENV_ID = "sao_gym/Arithmetic-v0"


def run_demo(out_dir: Path, *, episodes: int = 16, concurrency: int = 16) -> dict[str, Any]:
    """Run the demo; write ``rollouts.jsonl`` and ``summary.json`` under ``out_dir``."""
    from transformers.utils import logging as hf_logging

    from sao_gym.models import tiny_model

    hf_logging.disable_progress_bar()
    out_dir.mkdir(parents=True, exist_ok=True)
    console = Console(stderr=True)
    console.print(f"[bold]sao_gym demo[/]: tiny model on {ENV_ID}, {episodes} episodes")
    model_dir = out_dir / "model"
    if not (model_dir / "config.json").exists():
        console.print(f"building the tiny model in {model_dir}")
        tiny_model(str(model_dir))
    start = time.monotonic()
    rollouts = asyncio.run(_play(str(model_dir), episodes, concurrency, console))
    elapsed = time.monotonic() - start
    with open(out_dir / "rollouts.jsonl", "w") as f:
        for r in rollouts:
            f.write(json.dumps(r.to_dict()) + "\n")
    summary = {
        **EpisodeSummary.of(rollouts).__dict__,
        "elapsed_s": round(elapsed, 2),
        "action_tokens_per_s": round(sum(r.num_action_tokens for r in rollouts) / elapsed, 1),
        "rollouts": str(out_dir / "rollouts.jsonl"),
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


async def _play(model_dir: str, episodes: int, concurrency: int, console: Console) -> list[Rollout]:
    from transformers import AutoTokenizer

    from sao_gym.agents import LLMAgent
    from sao_gym.inference.hf import HFBackend

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    backend = HFBackend(model_dir, max_batch_size=concurrency)
    columns = (TextColumn("episodes"), BarColumn(), MofNCompleteColumn(),
               TextColumn("reward {task.fields[reward]:.2f}"), TimeElapsedColumn())
    try:
        with Progress(*columns, console=console, disable=not console.is_terminal) as bar:
            task = bar.add_task("play", total=episodes, reward=0.0)
            done: list[Rollout] = []

            def on_done(r: Rollout) -> None:
                done.append(r)
                mean = sum(x.reward for x in done) / len(done)
                bar.update(task, advance=1, reward=mean)
                if not console.is_terminal:
                    console.print(f"episode {len(done)}/{episodes}: reward {r.reward:.0f}, "
                                  f"{r.metrics['turns']:.0f} turns, {r.stop_reason.value}")

            return await run_episodes(
                lambda: sao_gym.make(ENV_ID),
                lambda: LLMAgent(backend, tokenizer, max_new_tokens=48, max_context_tokens=1024),
                episodes, concurrency=concurrency, on_done=on_done,
            )
    finally:
        await backend.aclose()
