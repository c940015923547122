"""The TRL side of benchmarks/vs_trl.py; runs in the TRL venv: python vs_trl_runner.py SPEC.json.

Trains TRL's GRPOTrainer from SPEC's checkpoint for SPEC's wall-clock budget with the
shared reward (:func:`vs_trl_task.score`); writes RUN_DIR/train.json and RUN_DIR/policy.

``num_generations=8`` and ``per_device_train_batch_size=64``: one step is 8 prompts x 8
completions; ``beta=0`` (no reference model), TRL's default loss (``dapo``), no activation
checkpointing (TRL turns it on by default; a 4M model needs no memory saving, and it would
only slow TRL down); a ``TrainerCallback`` stops training when the budget is spent.
Generated tokens are counted in the reward function from ``completion_ids`` (end-of-turn
token included, as on the SAO side).
"""
import json
import resource
import sys
import time

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer
from vs_trl_task import score


class Budget(TrainerCallback):
    """Stops training at the end of the first step past the wall-clock budget."""

    def __init__(self, seconds):
        self.seconds, self.start, self.end = seconds, None, None

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.monotonic()

    def on_step_end(self, args, state, control, **kwargs):
        if time.monotonic() - self.start >= self.seconds:
            control.should_training_stop = True

    def on_train_end(self, args, state, control, **kwargs):
        self.end = time.monotonic()


def main(spec_path):
    with open(spec_path) as f:
        spec = json.load(f)
    counts = {"completions": 0, "tokens": 0}

    def answer_reward(completions, answer, completion_ids=None, **kwargs):
        counts["completions"] += len(completions)
        counts["tokens"] += sum(len(ids) for ids in completion_ids)
        return [score(c[0]["content"], a) for c, a in zip(completions, answer, strict=True)]

    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    data = Dataset.from_list([
        {"prompt": [{"role": "user", "content": t["prompt"]}], "answer": t["answer"]}
        for t in spec["tasks"]])
    config = GRPOConfig(
        output_dir=spec["run_dir"] + "/trl_out", learning_rate=spec["lr"],
        lr_scheduler_type="constant", warmup_steps=0, max_steps=1_000_000,
        per_device_train_batch_size=spec["batch"], gradient_accumulation_steps=1,
        num_generations=spec["generations"], max_completion_length=spec["max_new_tokens"],
        temperature=1.0, top_p=1.0, top_k=0, beta=0.0, max_grad_norm=1.0,
        activation_checkpointing=False, use_cpu=True, bf16=False, fp16=False,
        report_to="none", logging_steps=1, save_strategy="no", disable_tqdm=True,
        dataloader_num_workers=0, seed=spec["seed"])
    budget = Budget(spec["seconds"])
    trainer = GRPOTrainer(model=model, reward_funcs=answer_reward, args=config,
                          train_dataset=data, processing_class=tokenizer, callbacks=[budget])
    trainer.train()
    trainer.save_model(spec["run_dir"] + "/policy")
    history = trainer.state.log_history
    rss = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
              resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    result = {
        "steps": trainer.state.global_step, "completions": counts["completions"],
        "generated_tokens": counts["tokens"], "wall_s": round(budget.end - budget.start, 2),
        "peak_rss_mb": round(rss / 1024, 1), "policy": spec["run_dir"] + "/policy",
        "train_rewards": [round(h["reward"], 4) for h in history if "reward" in h],
        "mean_length_logged": [h["completions/mean_length"] for h in history
                               if "completions/mean_length" in h],
        "torch_threads": torch.get_num_threads(),
    }
    with open(spec["run_dir"] + "/train.json", "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main(sys.argv[1])
