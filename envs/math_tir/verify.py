r"""Grading math answers with a time bound: math-verify, a sympy fallback, generator scorers.

math-verify's own timeouts use ``signal.alarm``, which only works in a
process's main thread; environments run in threads and event loops. So
every grade runs in a separate *verifier worker* process (a small pool,
shared by all environments of the process) where ``parse``/``verify`` are
called with their timeouts disabled (``parsing_timeout=None``,
``timeout_seconds=None``), and the caller enforces its own deadline: a
worker that runs past it (``verify`` on ``9^{9^{9^9}}`` never returns) is
killed and replaced, and the answer counts as wrong. A thread alone would
not do: sympy's big-integer arithmetic holds the GIL, so a stuck grade in
a thread would stall the event loop too. The caller waits in a thread
(:func:`asyncio.to_thread`) on the worker's pipe, so the loop stays free.

How an answer is compared with the reference (:func:`grade_sync`):

1. ``math_verify`` parses the reference (as ``$...$``, then as is) and the
   answer (as ``\boxed{...}``, then as is) and ``verify`` compares them.
2. Sympy fallback: where math-verify cannot parse a side, or misreads
   Python-style input (``2**10``, ``3*pi``, ``sqrt(2)/2``), the text is
   parsed by :func:`safe_sympify` (a whitelist of Python syntax turned into
   sympy objects; never ``eval``) and compared the same way.
3. Tasks of reasoning-gym generators whose answers are not plain numbers
   are graded by the generator's own ``score_answer`` (see
   :mod:`sao_gym.envs.math_tir.data`). Several of those scorers ``eval``
   the answer (sympy's ``parse_expr``), so the answer first passes
   :func:`screen_for_scorer` (no calls but to math functions, no attribute
   access, no strings, no underscores); a refused answer scores 0.

The worker is a separate process with an address-space limit and a
deadline; it is not a security sandbox (it runs as the caller's user).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from sao_gym.envs.math_tir.safe_parse import (
    MAX_ANSWER_CHARS,
    extract_boxed,
    safe_sympify,
    screen_for_scorer,
)
from sao_gym.registration import import_optional

logger = logging.getLogger(__name__)

WORKER_MEMORY_MB = 4096
"""Address-space limit of a verifier worker."""
WORKER_START_TIMEOUT_S = 120.0
"""How long a new worker may take to import sympy and math-verify."""
_HEADER = struct.Struct(">I")


class VerifierUnavailable(RuntimeError):
    """A verifier worker could not be started (an infrastructure failure)."""


@dataclass(frozen=True)
class GradeResult:
    """The verdict on one answer."""

    correct: bool
    """The answer matches the reference."""
    parsed: bool
    """The answer could be read as a mathematical answer (or passed the scorer screen)."""
    method: str
    """What decided: ``math_verify``, ``sympy``, ``scorer``, ``screen``, ``timeout``,
    ``too_long``, ``crash`` or ``none``."""
    detail: str = ""
    """A short explanation (for logs and tests; never shown to the model)."""
    seconds: float = 0.0
    """Wall-clock time of the grade, worker round trip included."""
    score: float | None = None
    """The raw score of a generator's ``score_answer`` (scorer grading only)."""

    @property
    def timed_out(self) -> bool:
        """The grade ran past its deadline."""
        return self.method == "timeout"


# ---------------------------------------------------------------------------------------------
# the grading itself (runs inside a worker)
# ---------------------------------------------------------------------------------------------
_MV_LOADED = False


def _math_verify() -> tuple[Any, Any]:
    global _MV_LOADED
    if not _MV_LOADED:
        # math-verify warns once that its timeouts are off: that is deliberate here.
        for name in ("math_verify.parser", "math_verify.grader"):
            logging.getLogger(name).setLevel(logging.ERROR)
        _MV_LOADED = True
    math_verify = import_optional("math_verify", needed_by="MathTIR (grading)")

    return math_verify.parse, math_verify.verify


def _parse(text: str) -> list[Any]:
    parse, _ = _math_verify()
    return parse(text, parsing_timeout=None, raise_on_error=False)


def _parse_reference(gold: str) -> list[Any]:
    return _parse(gold if "\\boxed" in gold else f"${gold}$") or _parse(gold)


def _parse_answer(pred: str, free_text: bool = False) -> list[Any]:
    if free_text or "\\boxed" in pred:
        return _parse(pred)
    return _parse(f"\\boxed{{{pred}}}") or _parse(pred)


def _equal(gold: list[Any], pred: list[Any]) -> bool:
    _, verify = _math_verify()
    return bool(verify(gold, pred, timeout_seconds=None, raise_on_error=False))


def grade_math(gold: str, pred: str, free_text: bool = False) -> dict[str, Any]:
    """Compare ``pred`` with the reference ``gold`` (no time bound: call in a worker).

    math-verify first; then every pairing with the :func:`safe_sympify`
    forms of either side (Python-style answers such as ``2**10``).
    ``free_text``: ``pred`` is a whole message (math-verify finds the
    answer in it), not just the answer.
    """
    gold_mv, pred_mv = _parse_reference(gold), _parse_answer(pred, free_text)
    if gold_mv and pred_mv and _equal(gold_mv, pred_mv):
        return {"correct": True, "parsed": True, "method": "math_verify"}
    gold_sp = safe_sympify(gold)
    pred_sp = None if free_text else safe_sympify(pred)
    golds = [g for g in (gold_mv, [gold_sp] if gold_sp is not None else []) if g]
    preds = [p for p in (pred_mv, [pred_sp] if pred_sp is not None else []) if p]
    for g in golds:
        for p in preds:
            if not (g is gold_mv and p is pred_mv) and _equal(g, p):
                return {"correct": True, "parsed": True, "method": "sympy"}
    method = "math_verify" if gold_mv and pred_mv else ("sympy" if preds else "none")
    return {"correct": False, "parsed": bool(preds), "method": method}


_DATASETS: dict[Any, Any] = {}


def grade_scorer(generator: str, options: dict[str, Any], entry: dict[str, Any],
                 answer: str) -> dict[str, Any]:
    """Grade with the reasoning-gym generator's ``score_answer`` (screened; call in a worker)."""
    reason = screen_for_scorer(answer)
    if reason is not None:
        return {"correct": False, "parsed": False, "method": "screen", "detail": reason}
    key = (generator, repr(sorted(options.items())))
    dataset = _DATASETS.get(key)
    if dataset is None:
        reasoning_gym = import_optional("reasoning_gym", needed_by="MathTIR (scorer grading)")

        dataset = _DATASETS[key] = reasoning_gym.create_dataset(generator, **options)
    score = float(dataset.score_answer(answer, entry))
    return {"correct": score >= 1.0, "parsed": True, "method": "scorer", "score": score}


def grade_sync(request: dict[str, Any]) -> dict[str, Any]:
    """Answer one worker request (``op``: ``math``, ``scorer`` or ``ping``)."""
    op = request.get("op")
    if op == "math":
        return grade_math(request["gold"], request["pred"], bool(request.get("free_text")))
    if op == "scorer":
        return grade_scorer(request["generator"], request["options"], request["entry"],
                            request["answer"])
    if op == "ping":
        return {"pong": True}
    raise ValueError(f"unknown op {op!r}")


# ---------------------------------------------------------------------------------------------
# the worker process and the pool
# ---------------------------------------------------------------------------------------------
def _write_frame(fd: int, payload: bytes) -> None:
    data = _HEADER.pack(len(payload)) + payload
    while data:
        n = os.write(fd, data)
        data = data[n:]


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    chunks, remaining = [], n
    while remaining:
        if deadline is not None:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([fd], [], [], wait)[0]:
                raise TimeoutError
        chunk = os.read(fd, min(remaining, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def _read_frame(fd: int, deadline: float | None) -> bytes:
    (size,) = _HEADER.unpack(_read_exact(fd, _HEADER.size, deadline))
    return _read_exact(fd, size, deadline)


def _worker_main() -> None:
    """Entry point of a verifier worker: frames of pickled requests in, JSON out.

    Requests come from the parent only (pickle); responses are JSON, so a
    worker subverted by an answer cannot feed the parent objects. Each
    request is also bounded by ``signal.alarm`` here (the worker's main
    thread), so an orphaned worker cannot run on.
    """
    import json

    try:
        import resource

        limit = WORKER_MEMORY_MB << 20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (ImportError, ValueError, OSError):
        pass
    logging.basicConfig(level=logging.ERROR)
    fd_in, fd_out = sys.stdin.fileno(), sys.stdout.fileno()
    sys.stdout = sys.stderr  # stray prints must not corrupt the protocol
    try:
        _math_verify()  # imports sympy too
        grade_math("1", "1")  # warm the caches
        ready: dict[str, Any] = {"ready": True}
    except Exception as e:  # noqa: BLE001 - reported to the parent
        ready = {"ready": False, "error": f"{type(e).__name__}: {e}"}
    _write_frame(fd_out, json.dumps(ready).encode())
    if not ready["ready"]:
        return
    while True:
        try:
            request = pickle.loads(_read_frame(fd_in, None))
        except EOFError:
            return
        signal.alarm(int(request.pop("alarm_s", 0)))
        try:
            response = grade_sync(request)
        except Exception as e:  # noqa: BLE001 - a grader error is a wrong answer, not a crash
            response = {"correct": False, "parsed": False, "method": "none",
                        "detail": f"{type(e).__name__}: {str(e)[:200]}"}
        signal.alarm(0)
        _write_frame(fd_out, json.dumps(response, default=str).encode())


class _Worker:
    """One verifier process."""

    def __init__(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        code = "from sao_gym.envs.math_tir.verify import _worker_main; _worker_main()"
        try:
            self.proc = subprocess.Popen(  # noqa: S603 - our own interpreter and module
                [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL, env=env, close_fds=True,
            )
        except OSError as e:
            raise VerifierUnavailable(f"cannot start a verifier worker: {e}") from None
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.fd_in, self.fd_out = self.proc.stdin.fileno(), self.proc.stdout.fileno()
        import json

        try:
            ready = json.loads(_read_frame(self.fd_out, time.monotonic() + WORKER_START_TIMEOUT_S))
        except (TimeoutError, EOFError, ValueError) as e:
            self.kill()
            raise VerifierUnavailable(f"the verifier worker did not start ({e!r})") from None
        if not ready.get("ready"):
            self.kill()
            raise VerifierUnavailable(f"the verifier worker failed to start: {ready.get('error')}")

    def call(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        import json

        payload = pickle.dumps({**request, "alarm_s": int(timeout_s) + 5})
        _write_frame(self.fd_in, payload)
        return json.loads(_read_frame(self.fd_out, time.monotonic() + timeout_s))

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


class VerifierPool:
    """Up to ``max_workers`` verifier processes, started on demand and reused.

    :meth:`call` blocks (use it from a thread): it takes an idle worker (or
    starts one), sends the request and waits up to ``timeout_s``; a worker
    past its deadline, or one that died, is killed and not reused.
    """

    def __init__(self, max_workers: int = 2) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self.max_workers = max_workers
        self._slots = threading.BoundedSemaphore(max_workers)
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()
        self.started = 0
        """Workers started so far (a measure of restarts after timeouts)."""

    def call(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Run one request in a worker.

        Raises ``TimeoutError``, ``EOFError``/``OSError`` (the worker died) or
        :class:`VerifierUnavailable`.
        """
        with self._slots:
            with self._lock:
                worker = self._idle.pop() if self._idle else None
            if worker is None or worker.proc.poll() is not None:
                worker = _Worker()
                self.started += 1
            try:
                out = worker.call(request, timeout_s)
            except BaseException:
                worker.kill()
                raise
            with self._lock:
                self._idle.append(worker)
            return out

    def close(self) -> None:
        """Kill the idle workers (busy ones are killed when their call ends or times out)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.kill()


_POOL: VerifierPool | None = None
_POOL_LOCK = threading.Lock()


def verifier_pool() -> VerifierPool:
    """The process-wide pool (``min(4, cpus)`` workers; closed at exit)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = VerifierPool(max(1, min(4, os.cpu_count() or 1)))
            atexit.register(_POOL.close)
        return _POOL


def _blocking_grade(request: dict[str, Any], timeout_s: float) -> GradeResult:
    start = time.perf_counter()
    pool = verifier_pool()
    out: dict[str, Any] = {}
    for attempt in (1, 2):
        try:
            out = pool.call(request, timeout_s)
            break
        except TimeoutError:
            return GradeResult(False, False, "timeout", f"grading ran past {timeout_s:g} s",
                               time.perf_counter() - start)
        except (EOFError, OSError) as e:
            if attempt == 2:
                return GradeResult(False, False, "crash", f"the verifier died ({e!r})",
                                   time.perf_counter() - start)
    score = out.get("score")
    return GradeResult(bool(out.get("correct")), bool(out.get("parsed")),
                       str(out.get("method", "none")), str(out.get("detail", "")),
                       time.perf_counter() - start, None if score is None else float(score))


async def grade_answer(
    answer: str, task: dict[str, Any], *, timeout_s: float = 10.0, free_text: bool = False
) -> GradeResult:
    """Grade ``answer`` against ``task`` (its ``answer``, or its generator's scorer).

    ``free_text``: ``answer`` is a whole message, not just the final answer.

    Runs in a verifier worker with the deadline ``timeout_s``; the event
    loop is never blocked. Raises :class:`VerifierUnavailable` when no worker
    can be started (an infrastructure failure).
    """
    if len(answer) > MAX_ANSWER_CHARS:
        return GradeResult(False, False, "too_long", f"answer longer than {MAX_ANSWER_CHARS}")
    if not answer.strip():
        return GradeResult(False, False, "none", "empty answer")
    if task.get("grader") == "scorer":
        entry = {"question": task["prompt"], "answer": task["answer"],
                 "metadata": task.get("metadata", {})}
        request = {"op": "scorer", "generator": task["generator"],
                   "options": task.get("generator_options", {}), "entry": entry,
                   "answer": answer}
    else:
        request = {"op": "math", "gold": str(task["answer"]), "pred": answer,
                   "free_text": free_text}
    return await asyncio.to_thread(_blocking_grade, request, timeout_s)


__all__ = [
    "GradeResult",
    "VerifierPool",
    "VerifierUnavailable",
    "extract_boxed",
    "grade_answer",
    "grade_math",
    "safe_sympify",
    "screen_for_scorer",
    "verifier_pool",
]
