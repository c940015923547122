"""The learner's hyperparameters: :class:`LearnerConfig` (torch-free).

The defaults are the paper's where it states them (PAPER.md 5): policy lr
1e-6, critic lr 5x that, K = 2 critic updates per step, 10 critic-only
warm-up steps, length-adaptive policy lambda with alpha 1.5, critic lambda 1,
DIS band (0.3, 5.0), frozen-attention critic. Importing this module loads no
model code, so configs validate in a light install.

>>> LearnerConfig().critic_warmup_steps, LearnerConfig(lr=1e-4).lr
(10, 0.0001)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sao_gym.learner.schedule import LR_SCHEDULES

AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum")
"""Valid loss aggregations (:func:`sao_gym.learner.losses.aggregate` modes)."""

AUTOCAST_DTYPES = (None, "bfloat16")
"""Valid ``LearnerConfig.autocast`` values."""

@dataclass(frozen=True)
class EngineRow:
    """One row of :data:`ENGINES`: where an engine is built and what it can do."""

    build: str
    """``module:function`` of ``(model, config, lr, *, lora) -> Engine``, imported when a
    learner is built (so this table loads no torch)."""
    multi_rank: bool = False
    """The engine trains one model over several processes (``learner.ranks > 1``)."""
    offloads: bool = False
    """The engine can keep its shards in host memory (``learner.cpu_offload``)."""


ENGINES: dict[str, EngineRow] = {
    "local": EngineRow("sao_gym.learner.engine:local_engine"),
    "fsdp": EngineRow("sao_gym.learner.engine:fsdp_engine", multi_rank=True, offloads=True),
}
"""``learner.engine`` name -> :class:`EngineRow`: the one table of engines. A new engine
is its own module plus a row here; the learner builds it (:func:`engine_builder`) and a
run with ``learner.ranks > 1`` places its ranks, whichever engine it is."""


def engine_builder(name: str) -> Any:
    """The build function of engine ``name`` (:data:`ENGINES`), imported now."""
    import importlib

    module, _, function = ENGINES[name].build.partition(":")
    return getattr(importlib.import_module(module), function)


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""Default LoRA targets: every linear layer of a Llama/Qwen2-style decoder layer."""


@dataclass(frozen=True)
class LoraSettings:
    """``learner.lora``: train low-rank adapters (PEFT's LoRA) instead of the whole model.

    Only the adapters (and, for the critic, its value head and norms) are
    trained and reach the optimizer; docs/scale.md, "LoRA".
    """

    rank: int = 8
    """Rank r of each adapter (``B @ A``, ``A``: r x in, ``B``: out x r)."""
    alpha: float = 16.0
    """Scaling numerator: the adapter adds ``(alpha / rank) * B @ A`` to a weight."""
    dropout: float = 0.0
    """Dropout on the adapter's input while training (0: the learner's logprobs are
    exactly the sampler's)."""
    target_modules: tuple[str, ...] = LORA_TARGETS
    """Names (last path component) of the linear layers that get an adapter."""
    critic: bool = False
    """Also train the critic through adapters (its head and norms stay trainable)."""
    check_tolerance: float = 1e-3
    """Largest difference (nats) between the sampler's and the learner's logprob of
    the probe tokens after each update before the run stops (the adapter was not
    applied); raise it for a bf16 learner or sampler."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "target_modules", tuple(self.target_modules))
        if self.rank < 1 or not self.alpha > 0 or not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"lora needs rank >= 1, alpha > 0 and dropout in [0, 1); got "
                             f"rank {self.rank}, alpha {self.alpha}, dropout {self.dropout}")
        if not self.target_modules or not all(isinstance(t, str) and t
                                              for t in self.target_modules):
            raise ValueError("lora.target_modules must be a non-empty list of module names")
        if not self.check_tolerance > 0:
            raise ValueError(f"lora.check_tolerance must be > 0, got {self.check_tolerance}")

    @property
    def scaling(self) -> float:
        """``alpha / rank``, the factor of ``B @ A``."""
        return self.alpha / self.rank


@dataclass(frozen=True)
class LearnerConfig:
    """Hyperparameters of the learner (paper defaults where it states them)."""

    lr: float = 1e-6
    """Policy learning rate (AdamW)."""
    critic_lr: float | None = None
    """Critic learning rate; ``None`` means 5x ``lr``."""
    eps_low: float | None = None
    """Lower band/clip width; ``None``: 0.3 for DIS, 0.2 for PPO clip."""
    eps_high: float | None = None
    """Upper band/clip width; ``None``: 5.0 for DIS, 0.28 for PPO clip (clip-higher)."""
    aggregation: str = "token_mean"
    """Loss aggregation: token_mean, seq_mean_token_mean or seq_mean_token_sum."""
    gamma: float = 1.0
    """Discount."""
    lambda_alpha: float = 1.5
    """Length-adaptive policy lambda: 1 - 1/(alpha * action tokens)."""
    critic_lambda: float = 1.0
    """GAE lambda of the critic's targets (1: Monte-Carlo returns)."""
    critic_updates: int = 2
    """Critic optimizer steps per learner step (K)."""
    critic_warmup_steps: int = 10
    """First learner steps that train only the critic."""
    critic_freeze: str | None = "attention"
    """``"attention"`` freezes the critic's attention projections; ``None`` trains all."""
    critic_layers: int | None = None
    """Decoder layers of the critic: ``None`` keeps all of the checkpoint's (the
    paper's full-size critic); ``N`` keeps its first ``N`` (a shallower, cheaper
    value model: each critic update then costs about ``N / layers`` of a full one)."""
    bootstrap_truncated: bool = False
    """Truncated rollouts (turn limit, context or token budget) bootstrap their
    return from the critic's value at the end of their final observation, where
    the next action would start (True; one without it, cut by the context, ends
    with its reward), or
    end with their reward like terminated ones (False: the limit is part of the
    task, as when evaluation counts it a failure)."""
    value_clip: float | None = None
    """PPO-style value clipping around the pre-update values; ``None``: plain MSE."""
    running_mean_window: int = 8
    """Rewards in the running-mean baseline's window."""
    running_mean_per_prompt: bool = True
    """One window per task (True) or one global window (False)."""
    policy_minibatches: int = 1
    """Policy optimizer steps per learner step: the batch's rollouts are cut into
    this many parts (fewer if the batch has fewer rollouts), one step each."""
    max_tokens_per_microbatch: int = 16384
    """Padded tokens per forward/backward pass (gradient accumulation beyond)."""
    lr_schedule: str = "constant"
    """``constant``, ``linear`` or ``cosine``: both learning rates fall from their
    base value to ``lr_final_ratio`` times it over the run's total steps."""
    lr_warmup_steps: int = 0
    """Linear learning-rate warm-up over each model's first updates (0: none): the
    critic's from learner step 0, the policy's from its first update (after
    ``critic_warmup_steps``). Multiplies the ``lr_schedule`` factor."""
    lr_final_ratio: float = 0.1
    """Share of the base learning rates left at the end of a decaying schedule."""
    max_grad_norm: float | None = 1.0
    """Gradient-norm clipping for both models; ``None`` disables clipping."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    dtype: str = "float32"
    """Parameter dtype of both models."""
    autocast: str | None = None
    """``"bfloat16"``: forward passes of both models under ``torch.autocast`` to
    bf16 (weights, optimizer state and the loss math stay in ``dtype``). Only
    worth it where the device computes bf16 natively (GPUs; CPUs with
    AVX512-BF16 or AMX); elsewhere it is much slower and the learner warns.
    ``benchmarks/learner.py`` reports its logprob error against fp32."""
    device: str = "cpu"
    """Device of both models (``fsdp``: ``cpu``, or ``cuda`` for each rank's own GPU)."""
    engine: str = "local"
    """``local``: each model whole on one device; ``fsdp``: sharded over
    ``ranks`` processes with PyTorch FSDP2 (docs/scale.md)."""
    ranks: int = 1
    """Learner processes (``fsdp``): gloo on the CPU, NCCL on GPUs."""
    lora: LoraSettings | None = None
    """Low-rank adapters instead of full fine-tuning (:class:`LoraSettings`; null: off)."""
    cpu_offload: bool = False
    """``engine: fsdp`` on GPUs: keep each rank's shards of parameters, gradients and
    AdamW state in host memory (FSDP2's ``CPUOffloadPolicy``; the optimizer steps on
    the CPU). Frees GPU memory for activations at the cost of host transfers."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward pass instead of
    keeping them (transformers' mechanism, non-reentrant): less memory for long
    micro-batches, about one more forward pass of time; the same gradients."""
    release_host_memory: bool = True
    """On the CPU, return the heap memory a training pass frees to the OS as it goes
    (glibc's ``malloc_trim`` around each backward pass, after each optimizer step and
    as a pass enters each decoder layer): a peak near the live tensors' size instead of
    GBs of freed blocks kept resident, for ~7% of step time (docs/scale.md). False:
    keep the allocator's own behaviour. No effect on GPUs."""
    seed: int = 0
    """Seeds the critic head and the torch RNG."""

    def __post_init__(self) -> None:
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {AGGREGATIONS}")
        for name in ("lr", "lambda_alpha", "max_tokens_per_microbatch",
                     "running_mean_window", "policy_minibatches"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.critic_updates < 0 or self.critic_warmup_steps < 0 or self.lr_warmup_steps < 0:
            raise ValueError("critic_updates, critic_warmup_steps and lr_warmup_steps must "
                             "be >= 0")
        if not 0.0 < self.gamma <= 1.0 or not 0.0 <= self.critic_lambda <= 1.0:
            raise ValueError("gamma must be in (0, 1] and critic_lambda in [0, 1]")
        if self.critic_layers is not None and self.critic_layers < 1:
            raise ValueError(f"critic_layers must be >= 1 or None, got {self.critic_layers}")
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {tuple(ENGINES)}, got {self.engine!r}")
        row = ENGINES[self.engine]
        if self.ranks < 1 or (not row.multi_rank and self.ranks != 1):
            raise ValueError(f"ranks must be >= 1, and 1 for engine {self.engine} (engines of "
                             f"several ranks: {[n for n, r in ENGINES.items() if r.multi_rank]});"
                             f" got {self.ranks}")
        if self.cpu_offload and (not row.offloads or self.device != "cuda"):
            raise ValueError(f"cpu_offload needs an engine that offloads "
                             f"({[n for n, r in ENGINES.items() if r.offloads]}) on device cuda "
                             "(it moves GPU shards to the host)")
        if self.autocast not in AUTOCAST_DTYPES:
            raise ValueError(f"autocast must be one of {AUTOCAST_DTYPES}, got {self.autocast!r}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"lr_schedule must be one of {LR_SCHEDULES}, got {self.lr_schedule!r}")
        if not 0.0 <= self.lr_final_ratio <= 1.0:
            raise ValueError(f"lr_final_ratio must be in [0, 1], got {self.lr_final_ratio}")


SFT_TARGET_METRICS = ("sampled", "greedy")
"""What a warm start's early stop watches: :func:`~sao_gym.learner.sft.holdout_success`'s
two estimates."""


@dataclass(frozen=True)
class SFTSettings:
    """How :func:`~sao_gym.learner.sft.sft` fine-tunes on demonstrations (one record).

    The run's builder makes one from ``warm_start``
    (:func:`~sao_gym.runtime.config.build.prepare_plan`); a script makes its own.

    >>> SFTSettings(steps=40, lr=3e-3, batch_size=2).warmup_steps
    0
    """

    steps: int
    """Most AdamW steps (the early stop may end sooner)."""
    lr: float
    """Peak learning rate."""
    batch_size: int
    """Demonstrations per step (drawn without replacement, reshuffled each pass)."""
    seed: int = 0
    """Data order and the torch RNG."""
    warmup_steps: int = 0
    """Linear learning-rate warm-up."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: float | None = 1.0
    """Gradient-norm clipping (None: off)."""
    label_smoothing: float = 0.0
    """Label smoothing e of the action-token cross-entropy, in [0, 1)."""
    max_tokens_per_microbatch: int = 8192
    """Padded tokens per forward/backward pass (gradient accumulation beyond)."""
    target_success: float | None = None
    """Stop once the held-out ``target_metric`` estimate reaches this (needs held-out
    demonstrations); None: run every step."""
    target_metric: str = "sampled"
    """``sampled`` (temperature 1) or ``greedy``."""
    min_sampled: float | None = None
    """... and only once the sampled estimate is at least this (None: no floor)."""
    check_every: int = 10
    """Steps between held-out estimates."""
    log_every: int = 10
    """Steps between progress lines in the log (0: none)."""
    save_every_s: float = 600.0
    """Seconds between saved training states (with a ``state_dir``; 0: every step)."""

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1 or not self.lr > 0 or self.warmup_steps < 0:
            raise ValueError(
                f"need steps >= 1, batch_size >= 1, lr > 0, warmup_steps >= 0; got "
                f"steps={self.steps}, batch_size={self.batch_size}, lr={self.lr}, "
                f"warmup_steps={self.warmup_steps}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.target_success is not None and not 0.0 < self.target_success <= 1.0:
            raise ValueError(f"target_success must be in (0, 1], got {self.target_success}")
        if self.target_metric not in SFT_TARGET_METRICS:
            raise ValueError(f"target_metric must be one of {SFT_TARGET_METRICS}, got "
                             f"{self.target_metric!r}")
        if self.check_every < 1:
            raise ValueError(f"check_every must be >= 1, got {self.check_every}")
        if self.min_sampled is not None and not 0.0 <= self.min_sampled <= 1.0:
            raise ValueError(f"min_sampled must be in [0, 1], got {self.min_sampled}")
