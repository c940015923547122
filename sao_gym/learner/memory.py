"""What fits where: the learner's memory per rank, estimated from a model's config.

:func:`learner_memory` adds up what one learner rank holds at its peak (the
backward pass of a micro-batch) for a Llama/Qwen2-style decoder (a
Hugging Face config, or a dict with its fields):

- **model state**: parameters (``param_bytes`` each; 1/ranks under FSDP,
  plus the units FSDP gathers around the one it computes), gradients of the
  trained parameters (all of them, or the LoRA adapters), and AdamW's two
  moments (fp32) -- 1/ranks under FSDP, or on the host with
  ``optimizer_offload``;
- **activations** kept for the backward pass: per token and decoder layer,
  the tensors a layer saves (two RMSNorm inputs and outputs, the
  q/k/v/attention-output projections and rotary copies, the SDPA output and
  its statistics, the MLP's gate, up, activation and product), with
  gradient checkpointing only each layer's input plus one layer recomputed;
  the LM head's working set (:mod:`sao_gym.learner.head`: a chunk of at
  most ``LOGIT_BUDGET`` fp32 logits, its softmax and its gradient, never the
  whole ``T x vocab``); and the backward pass's widest gradients;
- **the critic** (``critic=True``), a second backbone of the same shape with
  a one-unit head: its own state, and activations when it trains (the
  learner trains the two one after the other, so the larger peak counts).

The numbers are those of the tensors counted above (``ALLOCATOR_SLACK`` is
1: nothing is fitted). Measured against ``benchmarks/learner.py --scale`` on
SmolLM2-135M (docs/benchmarks.md, "The learner at scale"), the peak resident
memory of a CPU process also holds what glibc's allocator keeps of freed
blocks; docs/scale.md gives the measured error. Time is not estimated.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sao_gym.learner.config import LORA_TARGETS
from sao_gym.learner.head import chunk_rows

GIB = 2**30

ALLOCATOR_SLACK = 1.0
"""Factor from live tensors to resident memory (not fitted: 1; see the module docs)."""

HEAD_CHUNKS = 3
"""Chunks of logits the LM head holds at once: the logits, their softmax, its gradient."""


@dataclass(frozen=True)
class Shape:
    """The sizes of a decoder-only transformer that memory depends on."""

    hidden: int
    layers: int
    intermediate: int
    vocab: int
    heads: int
    kv_heads: int
    head_dim: int
    tied: bool = True
    qkv_bias: bool = False

    @classmethod
    def of(cls, config: Any) -> Shape:
        """From a Hugging Face config (or a mapping with its field names)."""
        get = (config.get if isinstance(config, Mapping)
               else lambda k, d=None: getattr(config, k, d))
        hidden, heads = int(get("hidden_size")), int(get("num_attention_heads"))
        return cls(hidden=hidden, layers=int(get("num_hidden_layers")),
                   intermediate=int(get("intermediate_size")), vocab=int(get("vocab_size")),
                   heads=heads, kv_heads=int(get("num_key_value_heads", heads) or heads),
                   head_dim=int(get("head_dim", None) or hidden // heads),
                   tied=bool(get("tie_word_embeddings", True)),
                   qkv_bias=bool(get("attention_bias", None) or get("model_type") == "qwen2"))

    def linears(self) -> dict[str, tuple[int, int]]:
        """``name -> (in, out)`` of one decoder layer's linear layers."""
        h, q, kv, i = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, \
            self.intermediate
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}

    def layer_parameters(self) -> int:
        """Parameters of one decoder layer (its linears, biases, two norms)."""
        bias = (self.heads + 2 * self.kv_heads) * self.head_dim if self.qkv_bias else 0
        return sum(a * b for a, b in self.linears().values()) + bias + 2 * self.hidden

    def parameters(self) -> int:
        """Parameters of the causal LM (embeddings, layers, final norm, LM head if untied)."""
        embed = self.vocab * self.hidden
        return embed * (1 if self.tied else 2) + self.layers * self.layer_parameters() \
            + self.hidden

    def lora_parameters(self, rank: int, targets: tuple[str, ...] = LORA_TARGETS) -> int:
        """Adapter parameters of rank ``rank`` on ``targets`` in every layer."""
        return self.layers * sum(rank * (a + b) for name, (a, b) in self.linears().items()
                                 if name in targets)

    def attention_parameters(self) -> int:
        """Attention projections of all layers (what ``critic_freeze: attention`` freezes)."""
        per = sum(a * b for n, (a, b) in self.linears().items()
                  if n in ("q_proj", "k_proj", "v_proj", "o_proj"))
        return self.layers * per

    def activations_per_token(self) -> int:
        """Values one decoder layer saves for its backward pass, per token (see module docs)."""
        h, q, kv, i = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, \
            self.intermediate
        norms = 2 * 2 * h  # two RMSNorms: input and normalised output
        attention = 2 * q + 2 * kv + 2 * q + 2 * q + self.heads  # q,k,v; rotary; repeat_kv/SDPA
        mlp = 4 * i  # gate, up, act(gate), act(gate) * up
        return norms + attention + mlp + q  # + the attention output into o_proj


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one learner rank holds at its peak (module docs)."""

    params: int
    grads: int
    optimizer: int
    gathered: int
    activations: int
    critic: int = 0

    @property
    def state(self) -> int:
        """Parameters + gradients + optimizer state (what sharding divides)."""
        return self.params + self.grads + self.optimizer

    @property
    def total(self) -> int:
        """Everything, with the allocator's slack."""
        return int(ALLOCATOR_SLACK * (self.state + self.gathered + self.activations
                                      + self.critic))

    def fits(self, gib: float) -> bool:
        """Whether :attr:`total` fits in ``gib`` GiB."""
        return self.total <= gib * GIB


def learner_memory(config: Any, *, engine: str = "local", ranks: int = 1,
                   lora_rank: int | None = None, lora_targets: tuple[str, ...] = LORA_TARGETS,
                   gradient_checkpointing: bool = False, microbatch_tokens: int = 4096,
                   critic: bool = True, critic_lora: bool = False, param_bytes: int = 4,
                   compute_bytes: int | None = None, optimizer_offload: bool = False
                   ) -> MemoryEstimate:
    """Peak memory of one learner rank (module docs).

    Args:
        config: the policy's Hugging Face config (or a mapping of its fields).
        engine: ``local`` (``ranks`` must be 1) or ``fsdp``.
        ranks: learner ranks (FSDP divides parameters, gradients and AdamW state).
        lora_rank: LoRA adapters of this rank (None: full fine-tuning).
        lora_targets: the linear layers that get adapters.
        gradient_checkpointing: keep only each layer's input between forward and backward.
        microbatch_tokens: tokens of one forward/backward pass (``max_tokens_per_microbatch``).
        critic: also hold a critic of the same shape (SAO).
        critic_lora: train the critic through adapters too.
        param_bytes: bytes per parameter (4: fp32 master weights).
        compute_bytes: bytes per activation value (None: ``param_bytes``; 2 for bf16
            mixed precision).
        optimizer_offload: AdamW's state on the host, not the device.

    """
    if engine == "local" and ranks != 1:
        raise ValueError("engine local runs on one rank")
    if engine not in ("local", "fsdp") or ranks < 1 or microbatch_tokens < 1:
        raise ValueError("engine must be local or fsdp, ranks and microbatch_tokens >= 1")
    s = Shape.of(config)
    act = compute_bytes or param_bytes
    n = s.parameters()

    def model_state(trainable: int) -> tuple[int, int, int]:
        adam = 0 if optimizer_offload else 2 * 4 * trainable
        return n * param_bytes // ranks, trainable * param_bytes // ranks, adam // ranks

    trainable = s.lora_parameters(lora_rank, lora_targets) if lora_rank else n
    params, grads, optimizer = model_state(trainable)
    if lora_rank:  # the frozen base: all of its parameters, none of their gradients
        params = (n + trainable) * param_bytes // ranks
    gathered = 0
    if engine == "fsdp" and ranks > 1:  # the root unit (embeddings) and 2 layers, whole
        gathered = (s.vocab * s.hidden + 2 * s.layer_parameters()) * act
    T = microbatch_tokens
    per_layer = s.activations_per_token() * T * act
    layers = (s.layers * s.hidden * T * act + per_layer if gradient_checkpointing
              else s.layers * per_layer)
    head = HEAD_CHUNKS * min(T, chunk_rows(s.vocab)) * s.vocab * 4  # fp32 logits chunks
    activations = layers + head + 2 * per_layer  # + the backward's widest gradients
    critic_bytes = 0
    if critic:
        c_train = (s.lora_parameters(lora_rank, lora_targets) if critic_lora and lora_rank
                   else n - s.attention_parameters())
        c_params, c_grads, c_opt = model_state(c_train)
        critic_bytes = c_params + c_grads + c_opt  # its activations peak when the policy's don't
    return MemoryEstimate(params=params, grads=grads, optimizer=optimizer, gathered=gathered,
                          activations=activations, critic=critic_bytes)


QWEN25 = {
    "0.5B": dict(hidden_size=896, num_hidden_layers=24, intermediate_size=4864,
                 vocab_size=151936, num_attention_heads=14, num_key_value_heads=2,
                 tie_word_embeddings=True, model_type="qwen2"),
    "1.5B": dict(hidden_size=1536, num_hidden_layers=28, intermediate_size=8960,
                 vocab_size=151936, num_attention_heads=12, num_key_value_heads=2,
                 tie_word_embeddings=True, model_type="qwen2"),
    "7B": dict(hidden_size=3584, num_hidden_layers=28, intermediate_size=18944,
               vocab_size=152064, num_attention_heads=28, num_key_value_heads=4,
               tie_word_embeddings=False, model_type="qwen2"),
    "32B": dict(hidden_size=5120, num_hidden_layers=64, intermediate_size=27648,
                vocab_size=152064, num_attention_heads=40, num_key_value_heads=8,
                tie_word_embeddings=False, model_type="qwen2"),
}
"""The shapes of Qwen2.5 models (their configs' fields), for the table in docs/scale.md."""


def table(gpu_gib: float = 80.0, tokens: int = 8192) -> str:
    """The markdown table of docs/scale.md: SAO (policy and critic) per rank on 1 and 8 GPUs.

    fp32 master weights and AdamW, bf16 activations, ``tokens``-token micro-batches.
    """
    setups = [("full", {}), ("full + ckpt", {"gradient_checkpointing": True}),
              ("LoRA r16 + ckpt", {"lora_rank": 16, "critic_lora": True,
                                   "gradient_checkpointing": True})]
    lines = [f"| model | setup | 1 GPU: GiB (fits {gpu_gib:.0f}?) | 8 FSDP ranks: GiB per rank "
             "(fits?) |", "|---|---|---|---|"]
    for name, config in QWEN25.items():
        for label, kw in setups:
            cells = []
            for ranks in (1, 8):
                est = learner_memory(config, engine="local" if ranks == 1 else "fsdp",
                                     ranks=ranks, microbatch_tokens=tokens, compute_bytes=2, **kw)
                cells.append(f"{est.total / GIB:.1f} ({'yes' if est.fits(gpu_gib) else 'no'})")
            lines.append(f"| {name} | {label} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


__all__ = ["ALLOCATOR_SLACK", "GIB", "HEAD_CHUNKS", "QWEN25", "MemoryEstimate", "Shape",
           "learner_memory", "table"]


if __name__ == "__main__":
    print(table())
