"""In-process transformers inference with continuous batching: :class:`HFBackend`.

The model runs in one dedicated worker thread, never on the event loop.
``generate`` validates its input, queues a request and awaits a future that
the worker resolves through ``loop.call_soon_threadsafe``.

The worker decodes all running requests together with a shared, left-padded
KV cache (:class:`~sao_gym.inference.hf.batch.DecodeBatch`) in its own decode
loop (not ``model.generate``), so each row keeps its own temperature, top-p,
random stream, stop ids and token budget, and logprobs are computed exactly
(:func:`~sao_gym.inference.sampling.sample_next`). Scheduling, per loop
iteration of the worker:

1. apply pending weight updates (then re-encode every running row's context
   with the new weights, see below);
2. admit waiting requests into the running batch (*continuous batching*: a
   request arriving mid-batch is prefilled and merged at the next decode step,
   up to ``max_batch_size`` rows); when the batch was empty the worker first
   waits ``batch_wait_s`` so that a burst of requests is prefilled together;
3. sample one token for every row; finished or cancelled rows leave the batch
   at once (their KV cache rows are dropped);
4. run one decode forward pass for the remaining rows.

Weight updates are applied between decode steps while generations are in
flight. Each token records the version whose forward pass produced its
logits. After an update the running rows' KV caches are recomputed under the
new weights (one prefill of prompt + tokens so far), so a token sampled after
the update has exactly the logprob a fresh forward pass of the new weights
gives: the learner's recomputed logprob and the recorded one refer to the
same distribution.

Requests of one episode (the same ``SamplingParams.session_id``) reuse its
KV across turns: a finished request's KV is kept by session
(:mod:`~sao_gym.inference.hf.sessions`, bounded by ``session_cache_bytes``)
and the session's next request, whose prompt extends it, prefills only the
new tokens. A weight update drops every kept KV.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from sao_gym.inference.base import BackendClosed, prompt_list
from sao_gym.inference.hf.batch import DecodeBatch, ModelRunner
from sao_gym.inference.hf.sessions import SessionCache, SessionEntry
from sao_gym.inference.sampling import sample_next
from sao_gym.inference.weights import adapted, is_adapter, load_weights_dir, merge_adapter
from sao_gym.types import Generation, SamplingParams

logger = logging.getLogger(__name__)

DEFAULT_SESSION_CACHE_BYTES = 2**30
"""KV kept between the turns of episodes, all sessions together (1 GiB)."""


@dataclass
class BackendStats:
    """Counters kept by the worker (read them for tests and benchmarks)."""

    batch_sizes: collections.Counter[int] = field(default_factory=collections.Counter)
    """How many decode steps ran with each batch size (rows sampled per step)."""
    tokens_generated: int = 0
    """Tokens sampled so far, all requests together."""
    requests_finished: int = 0
    """Requests completed with a Generation."""
    prefill_calls: int = 0
    """Prefill passes: admissions of new requests and re-encodes after weight updates."""
    prefill_tokens: int = 0
    """Tokens encoded by prefill passes (a reused session prefix is not encoded again)."""
    reused_tokens: int = 0
    """Prompt tokens whose KV came from the session cache instead of a prefill."""
    weight_updates: int = 0
    """Weight updates applied."""

    @property
    def max_batch_size(self) -> int:
        """Largest batch size seen (0 before the first step)."""
        return max(self.batch_sizes, default=0)


@dataclass(eq=False)
class _Request:
    """One generate call as the worker sees it."""

    prompt: list[int]
    params: SamplingParams
    max_new: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Generation]
    generator: torch.Generator | None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    cancelled: bool = False

    @property
    def abandoned(self) -> bool:
        """Nobody waits for the result: the call was cancelled or its event loop closed."""
        return self.cancelled or self.loop.is_closed()


@dataclass(eq=False)
class _WeightUpdate:
    state_dict: Mapping[str, Any]
    version: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[None]


def _resolve(
    loop: asyncio.AbstractEventLoop,
    fut: asyncio.Future,
    result: Any = None,
    exc: BaseException | None = None,
) -> None:
    """Complete ``fut`` from any thread (no-op if it is done or its loop is closed)."""

    def _set() -> None:
        if fut.done():
            return
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(result)

    try:
        loop.call_soon_threadsafe(_set)
    except RuntimeError:  # the loop is closed: nobody is waiting any more
        pass


class HFBackend:
    """Token-in, token-out sampling from a local transformers causal LM.

    See the module docstring for the scheduling. ``max_batch_size`` bounds the
    rows decoded together; ``batch_wait_s`` is how long an idle worker waits
    after the first request to gather a burst; ``seed`` seeds the stream used
    by requests without their own ``SamplingParams.seed``;
    ``session_cache_bytes`` bounds the KV kept between the turns of an
    episode (requests with a ``SamplingParams.session_id``;
    :mod:`~sao_gym.inference.hf.sessions`; 0 turns the reuse off).
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        *,
        device: str = "cpu",
        dtype: str = "float32",
        max_batch_size: int = 32,
        batch_wait_s: float = 0.002,
        seed: int | None = None,
        policy_version: int = 0,
        session_cache_bytes: int = DEFAULT_SESSION_CACHE_BYTES,
    ) -> None:
        from sao_gym.models import load_policy

        model, tokenizer = load_policy(model_path, device=device, dtype=dtype)
        model.requires_grad_(False)
        self._setup(model, tokenizer, max_batch_size, batch_wait_s, seed, policy_version,
                    session_cache_bytes)

    @classmethod
    def from_model(
        cls,
        model: Any,
        tokenizer: Any = None,
        *,
        max_batch_size: int = 32,
        batch_wait_s: float = 0.002,
        seed: int | None = None,
        policy_version: int = 0,
        session_cache_bytes: int = DEFAULT_SESSION_CACHE_BYTES,
    ) -> HFBackend:
        """Wrap an already loaded model (kept on its device and dtype; not copied)."""
        self = cls.__new__(cls)
        self._setup(model, tokenizer, max_batch_size, batch_wait_s, seed, policy_version,
                    session_cache_bytes)
        return self

    def _setup(
        self,
        model: Any,
        tokenizer: Any,
        max_batch_size: int,
        batch_wait_s: float,
        seed: int | None,
        policy_version: int,
        session_cache_bytes: int,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        model.eval()
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self.stats = BackendStats()
        self._runner = ModelRunner(model)
        self._runner.new_cache()  # fail now, not in the worker, for unsupported models
        self._device = next(model.parameters()).device
        self._vocab_size = int(model.get_input_embeddings().num_embeddings)
        self._max_positions = int(getattr(model.config, "max_position_embeddings", 0) or 1 << 30)
        self._version = policy_version
        self.sessions = SessionCache(session_cache_bytes)
        """Finished requests' KV by ``SamplingParams.session_id`` (:mod:`.sessions`)."""
        self._adapter_base: dict[str, torch.Tensor] | None = None
        """The weights LoRA adapters are merged into (those the first adapter changed)."""
        self._rng = torch.Generator()
        self._rng.manual_seed(seed if seed is not None else int.from_bytes(os.urandom(8), "little"))
        self._cond = threading.Condition()
        self._pending: collections.deque[_Request] = collections.deque()
        self._updates: collections.deque[_WeightUpdate] = collections.deque()
        self._closed = False
        self._batch: DecodeBatch | None = None
        self._thread = threading.Thread(target=self._worker, name="HFBackend-worker", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ API

    @property
    def policy_version(self) -> int:
        """Version of the weights currently used for sampling."""
        return self._version

    def counters(self) -> dict[str, int]:
        """Prompt tokens so far: ``prefill_tokens`` and ``reused_tokens``.

        Encoded by prefill passes, and whose KV an episode's earlier turn left in
        the session cache.
        """
        return {"prefill_tokens": self.stats.prefill_tokens,
                "reused_tokens": self.stats.reused_tokens}

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` was called."""
        return self._closed

    def _validate(self, prompt_ids: Sequence[int], params: SamplingParams) -> list[int]:
        prompt = prompt_list(prompt_ids, params)
        lo, hi = min(prompt), max(prompt)
        if lo < 0 or hi >= self._vocab_size:
            bad = lo if lo < 0 else hi
            raise ValueError(f"token id {bad} out of range [0, {self._vocab_size})")
        if len(prompt) >= self._max_positions:
            raise ValueError(
                f"prompt of {len(prompt)} tokens leaves no room to generate: the model has "
                f"{self._max_positions} positions"
            )
        return prompt

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        """Sample a continuation of ``prompt_ids``; batched with concurrent calls.

        Raises ``ValueError`` for an empty prompt, out-of-vocabulary ids or a
        prompt that fills the model's positions, and :class:`BackendClosed`
        after :meth:`aclose`. The generation ends with ``"length"`` when the
        model's positions run out before ``max_new_tokens``. Cancelling the
        call removes the request from the batch.
        """
        if self._closed:
            raise BackendClosed("HFBackend is closed")
        prompt = self._validate(prompt_ids, params)
        loop = asyncio.get_running_loop()
        generator = None
        if params.seed is not None and params.temperature > 0:
            generator = torch.Generator()
            generator.manual_seed(params.seed)
        req = _Request(
            prompt=prompt,
            params=params,
            max_new=min(params.max_new_tokens, self._max_positions - len(prompt)),
            loop=loop,
            future=loop.create_future(),
            generator=generator,
        )
        with self._cond:
            if self._closed:
                raise BackendClosed("HFBackend is closed")
            self._pending.append(req)
            self._cond.notify_all()
        try:
            return await req.future
        except asyncio.CancelledError:
            req.cancelled = True
            raise

    async def update_weights(
        self, weights: Mapping[str, Any] | str | os.PathLike[str], version: int
    ) -> None:
        """Load new weights (a state dict or a checkpoint directory) as ``version``.

        Returns once the worker applied them; running generations continue
        with the new weights from their next token on. The tensors of a state
        dict are copied into the model, so they must not change before this
        returns. Raises ``ValueError`` for unknown names or wrong shapes (the
        model is then left unchanged).
        """
        if self._closed:
            raise BackendClosed("HFBackend is closed")
        if isinstance(weights, (str, os.PathLike)):
            weights = await asyncio.to_thread(load_weights_dir, weights)
        loop = asyncio.get_running_loop()
        upd = _WeightUpdate(dict(weights), int(version), loop, loop.create_future())
        with self._cond:
            if self._closed:
                raise BackendClosed("HFBackend is closed")
            self._updates.append(upd)
            self._cond.notify_all()
        await upd.future

    async def aclose(self) -> None:
        """Stop the worker; pending and running requests fail with :class:`BackendClosed`."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        await asyncio.to_thread(self._thread.join)

    # --------------------------------------------------------------- worker

    def _worker(self) -> None:
        """Worker thread main loop: never raises, never leaves a future unresolved."""
        while True:
            work = self._wait_for_work()
            if work is None:
                break
            new, updates = work
            try:
                if updates:
                    self._apply_updates(updates)
                if new:
                    self._admit(new)
                if self._batch is not None:
                    self._decode_step()
            except Exception as e:  # a failed step fails its requests only
                logger.exception("HFBackend: decode step failed")
                self._fail_batch(e)
        self._shutdown()

    def _wait_for_work(self) -> tuple[list[_Request], list[_WeightUpdate]] | None:
        """Block until there is something to do; ``None`` means shut down."""
        with self._cond:
            while not (self._closed or self._pending or self._updates or self._batch):
                self._cond.wait()
            if self._closed:
                return None
            if self._batch is None and self._pending and self.batch_wait_s > 0:
                deadline = time.monotonic() + self.batch_wait_s
                while not self._closed and len(self._pending) < self.max_batch_size:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
                if self._closed:
                    return None
            updates = list(self._updates)
            self._updates.clear()
            free = self.max_batch_size - (len(self._batch) if self._batch else 0)
            new: list[_Request] = []
            while self._pending and len(new) < free:
                req = self._pending.popleft()
                if not req.abandoned:
                    new.append(req)
            return new, updates

    def _apply_updates(self, updates: list[_WeightUpdate]) -> None:
        """Copy new weights into the model, then re-encode the running rows under them."""
        applied = False
        for upd in updates:
            try:
                self._copy_weights(upd.state_dict)
            except Exception as e:  # report to the caller, keep serving
                _resolve(upd.loop, upd.future, exc=e)
                continue
            self._version = upd.version
            self.stats.weight_updates += 1
            applied = True
            logger.info("HFBackend: weights version %d applied", upd.version)
            _resolve(upd.loop, upd.future)
        if applied:
            self.sessions.clear()  # KV of the old weights: never reused
        if applied and self._batch is not None:
            batch, self._batch = self._batch, None
            rows = [r for r in batch.rows if not r.abandoned]
            del batch
            if rows:
                try:
                    self._batch = self._prefill(rows, [r.prompt + r.tokens for r in rows])
                except Exception as e:
                    logger.exception("HFBackend: re-encode after weight update failed")
                    for r in rows:
                        _resolve(r.loop, r.future, exc=e)

    def _copy_weights(self, state_dict: Mapping[str, Any]) -> None:
        """Validate every name and shape first, then copy (all or nothing).

        LoRA adapters (:func:`~sao_gym.inference.weights.is_adapter`) are
        merged into the weights the model had before the first adapter came
        (kept aside then); full weights replace those.
        """
        params = self.model.state_dict()
        if is_adapter(state_dict):
            missing = [k for k in adapted(state_dict) if k not in params]
            if missing:
                raise ValueError(f"the adapter changes weights the model lacks: {missing[:5]}")
            base = self._adapter_base if self._adapter_base is not None else {}
            for k in adapted(state_dict):  # not adapted before: as the model has them
                if k not in base:
                    base[k] = params[k].detach().clone()
            self._adapter_base = base
            state_dict = merge_adapter(base, state_dict)
        else:
            self._adapter_base = None
        unknown = [k for k in state_dict if k not in params]
        if unknown:
            raise ValueError(
                f"unknown weight names: {unknown[:5]}{'...' if len(unknown) > 5 else ''}"
            )
        for k, v in state_dict.items():
            if tuple(v.shape) != tuple(params[k].shape):
                raise ValueError(
                    f"shape of {k}: got {tuple(v.shape)}, model has {tuple(params[k].shape)}"
                )
        with torch.no_grad():
            for k, v in state_dict.items():
                params[k].copy_(v)

    def _prefill(self, rows: list[_Request], seqs: list[list[int]]) -> DecodeBatch:
        self.stats.prefill_calls += 1
        self.stats.prefill_tokens += sum(len(s) for s in seqs)
        with torch.inference_mode():
            return DecodeBatch.prefill(self._runner, seqs, rows, device=self._device)

    def _admit(self, new: list[_Request]) -> None:
        """Prefill new requests (after a reused session prefix) and merge them into the batch."""
        parts: list[DecodeBatch] = []
        fresh: list[_Request] = []
        for r in new:
            entry = (self.sessions.take(r.params.session_id, r.prompt, self._version)
                     if r.params.session_id is not None else None)
            if entry is None:
                fresh.append(r)
                continue
            try:
                parts.append(self._resume(r, entry))
            except Exception as e:  # only this request fails
                logger.exception("HFBackend: prefill after a cached prefix failed")
                _resolve(r.loop, r.future, exc=e)
        if fresh:
            try:
                parts.append(self._prefill(fresh, [r.prompt for r in fresh]))
            except Exception as e:  # only the new requests fail
                logger.exception("HFBackend: prefill failed")
                for r in fresh:
                    _resolve(r.loop, r.future, exc=e)
        with torch.inference_mode():
            for part in parts:
                if self._batch is None:
                    self._batch = part
                else:
                    self._batch.merge(part)

    def _resume(self, r: _Request, entry: SessionEntry) -> DecodeBatch:
        """A row for ``r`` that encodes only the prompt after ``entry``'s tokens."""
        suffix = r.prompt[len(entry.tokens):]
        self.stats.prefill_calls += 1
        self.stats.prefill_tokens += len(suffix)
        self.stats.reused_tokens += len(entry.tokens)
        with torch.inference_mode():
            return DecodeBatch.resume(self._runner, entry.keys, entry.values, suffix, r)

    def _keep_session(self, batch: DecodeBatch, i: int, r: _Request) -> None:
        """Cache finished row ``i``'s KV for its session's next request."""
        if r.params.session_id is None or self.sessions.max_bytes == 0 or r.abandoned:
            return
        keys, values = batch.row_cache(i)
        tokens = r.prompt + r.tokens[:-1]  # the last sampled token was never fed back
        if keys[0].shape[2] != len(tokens):  # pragma: no cover - a bookkeeping bug
            raise RuntimeError(f"cached row holds {keys[0].shape[2]} positions, expected "
                               f"{len(tokens)}")
        self.sessions.put(r.params.session_id,
                          SessionEntry(tokens, self._version, keys, values))

    def _decode_step(self) -> None:
        """Sample one token per row, retire finished rows, run one forward pass."""
        batch = self._batch
        assert batch is not None
        rows = batch.rows
        temps = torch.tensor([r.params.temperature for r in rows], dtype=torch.float64)
        top_ps = torch.tensor([r.params.top_p for r in rows], dtype=torch.float64)
        uniforms = torch.zeros(len(rows), dtype=torch.float64)
        shared = [i for i, r in enumerate(rows) if r.generator is None and r.params.temperature > 0]
        if shared:
            uniforms[shared] = torch.rand(len(shared), generator=self._rng, dtype=torch.float64)
        for i, r in enumerate(rows):
            if r.generator is not None:
                uniforms[i] = torch.rand(1, generator=r.generator, dtype=torch.float64)
        with torch.inference_mode():
            dev = batch.logits_BV.device
            tokens_B, logprobs_B = sample_next(
                batch.logits_BV, temps.to(dev), top_ps.to(dev), uniforms.to(dev)
            )
        tokens, logprobs = tokens_B.tolist(), logprobs_B.tolist()
        self.stats.batch_sizes[len(rows)] += 1
        self.stats.tokens_generated += len(rows)
        keep: list[int] = []
        for i, r in enumerate(rows):
            tok = tokens[i]
            r.tokens.append(tok)
            r.logprobs.append(logprobs[i])
            r.versions.append(self._version)
            if r.abandoned:
                continue
            if tok in r.params.stop_token_ids or len(r.tokens) >= r.max_new:
                with torch.inference_mode():
                    self._keep_session(batch, i, r)
                self._finish(r, "stop" if tok in r.params.stop_token_ids else "length")
            else:
                keep.append(i)
        with torch.inference_mode():
            batch.select(keep)
            if not batch.rows:
                self._batch = None
                return
            batch.step(self._runner, tokens_B[keep])

    def _finish(self, r: _Request, reason: str) -> None:
        self.stats.requests_finished += 1
        gen = Generation(
            token_ids=r.tokens,
            logprobs=r.logprobs,
            finish_reason=reason,
            policy_versions=r.versions,
        )
        _resolve(r.loop, r.future, result=gen)

    def _fail_batch(self, exc: BaseException) -> None:
        """Fail every running request with ``exc`` and drop the batch."""
        batch, self._batch = self._batch, None
        for r in batch.rows if batch is not None else []:
            _resolve(r.loop, r.future, exc=exc)

    def _shutdown(self) -> None:
        """Fail everything still queued or running with BackendClosed and release the model."""
        with self._cond:
            pending, self._pending = list(self._pending), collections.deque()
            updates, self._updates = list(self._updates), collections.deque()
        self._fail_batch(BackendClosed("HFBackend was closed during generation"))
        for r in pending:
            _resolve(r.loop, r.future, exc=BackendClosed("HFBackend is closed"))
        for u in updates:
            _resolve(u.loop, u.future, exc=BackendClosed("HFBackend is closed"))
        self.sessions.clear()
        self._runner = None  # type: ignore[assignment]
        self.model = None
        logger.info("HFBackend: worker stopped (%d tokens generated)", self.stats.tokens_generated)


__all__ = ["BackendStats", "HFBackend", "load_weights_dir"]
