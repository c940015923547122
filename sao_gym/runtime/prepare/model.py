"""The run's model before any warm start, from a :class:`~sao_gym.runtime.plans.ModelPlan`.

- :func:`base_policy`: ``tiny`` built in the run directory (its tokenizer
  trained on a general corpus plus the env's own text), ``smollm2`` converted
  once, or a checkpoint taken as it is (:func:`sao_gym.models.resolve_model`),
  with the plan's chat template put on it;
- :func:`env_corpus`: that env text: tasks rendered with their tools as the
  model will see them, played by the demonstrations' source when there is one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sao_gym.runtime.plans import DEMO_SEED_OFFSET, ModelPlan
from sao_gym.runtime.prepare.demonstrations import Demonstrations

COLLECT_NEW_TOKENS = 1024
"""Turn budget while demonstrations are played before the budgets are fitted."""


def base_policy(plan: ModelPlan, run_dir: str | Path, corpus: Any = ()) -> str:
    """The run's model before any warm start: built or found, with the plan's chat template.

    ``corpus``: extra text a new ``tiny`` model's tokenizer learns (:func:`env_corpus`).
    """
    from sao_gym.models import resolve_model, with_chat_template

    run_dir = Path(run_dir)
    policy = resolve_model(plan.name, run_dir, plan.seed, corpus=corpus,
                           options=dict(plan.options))
    if plan.chat_template is not None:
        policy = with_chat_template(policy, plan.chat_template, run_dir / "model" / "templated")
    return policy


def needs_corpus(plan: ModelPlan, run_dir: str | Path) -> bool:
    """The plan's model is a ``tiny`` one not built yet (its tokenizer learns the env)."""
    return plan.name == "tiny" and not (Path(run_dir) / "model" / "base" /
                                        "config.json").exists()


def env_corpus(plan: ModelPlan, make_env: Any, seed: int, demos: Demonstrations | None
               ) -> list[str]:
    """Text of the env as the model sees it: ``plan.corpus_episodes`` tasks with their tools.

    The tasks are played by ``demos`` when there are some, else only reset
    (episode ``i`` with seed ``seed + DEMO_SEED_OFFSET + i``). It trains the tiny
    model's tokenizer, so it is rendered with a provisional tokenizer of the
    general corpus (only its chat template matters here).
    """
    import tempfile

    from transformers import AutoTokenizer

    from sao_gym.models import COMPACT_TOOLS_TEMPLATE, _build_tokenizer

    tokenizer = _build_tokenizer(int(plan.options.get("vocab_size", 1024)))
    tokenizer.chat_template = COMPACT_TOOLS_TEMPLATE
    with tempfile.TemporaryDirectory() as tmp:  # a reload gives the class the agent uses
        tokenizer.save_pretrained(tmp)
        tokenizer = AutoTokenizer.from_pretrained(tmp)
    env = make_env()
    try:
        tools = env.reset(seed=seed)[1].get("tools") or []
    finally:
        env.close()
    episodes = plan.corpus_episodes
    if demos is not None:
        played, _ = demos.collect(tokenizer, episodes=episodes, holdout=0,
                                  budgets={"max_new_tokens": COLLECT_NEW_TOKENS})
        conversations = [r.messages for r in played]
    else:
        conversations = []
        for i in range(episodes):
            env = make_env()
            try:
                conversations.append(env.reset(seed=seed + DEMO_SEED_OFFSET + i)[0])
            finally:
                env.close()
    return [tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False)
            for messages in conversations]


__all__ = ["COLLECT_NEW_TOKENS", "base_policy", "env_corpus", "needs_corpus"]
