"""Metric loggers: one record of numbers per learner step.

This module is about *metrics* (what ``metrics.jsonl``, TensorBoard and W&B
show); library diagnostics go through the standard :mod:`logging` module.

- :class:`MetricLogger` is the protocol: ``log(step, metrics)`` and ``close()``.
- :class:`JsonlLogger` writes ``RUN_DIR/metrics.jsonl``, always on and the
  source of truth. Each line is fsynced as it is written, so a ``kill -9``
  loses at most the line being written, and ``resume_step=N`` repairs the
  file to exactly the steps ``<= N``.
- :class:`TensorBoardLogger` and :class:`WandbLogger` are optional mirrors
  (pip extras ``sao-gym[tensorboard]`` and ``sao-gym[wandb]``), imported lazily.
- :func:`make_loggers` builds the fan-out the trainer uses;
  :func:`read_metrics` reads a run's records back.

Non-finite values (nan, +-inf) are written to ``metrics.jsonl`` as JSON
``null``, so every line stays valid JSON for any reader; :class:`JsonlLogger`
counts them per metric (``nonfinite_counts``) and lists those of the last
step (``last_nonfinite``) so the trainer can react.

Example:
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as run_dir:
    ...     with make_loggers("jsonl", run_dir) as metric_logger:
    ...         metric_logger.log(1, {"loss/policy": 0.5, "sao/clip_ratio": float("nan")})
    ...     print(read_metrics(run_dir))
    [{'step': 1, 'loss/policy': 0.5, 'sao/clip_ratio': None}]

"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from sao_gym.utils.fs import fsync_path

__all__ = ["LOGGER_NAMES", "METRICS_FILE", "FanoutLogger", "JsonlLogger", "MetricLogger",
           "TensorBoardLogger", "WandbLogger", "make_loggers", "read_metrics"]

_log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
"""File name of the JSONL metrics inside a run directory."""

LOGGER_NAMES = ("jsonl", "tensorboard", "wandb")
"""Names :func:`make_loggers` accepts."""


@runtime_checkable
class MetricLogger(Protocol):
    """Receives one mapping of named numbers per learner step."""

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Record ``metrics`` for ``step`` (steps strictly increase)."""

    def close(self) -> None:
        """Flush and release resources; idempotent."""


class _ContextMixin:
    """``with logger: ...`` closes the logger on exit."""

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------
# JSONL


def _metrics_path(run_dir: str | os.PathLike[str]) -> Path:
    path = Path(run_dir)
    return path if path.suffix == ".jsonl" else path / METRICS_FILE


def _complete_lines(data: bytes) -> list[bytes]:
    """The newline-terminated lines of ``data``; a torn (unterminated) tail is dropped."""
    lines = data.split(b"\n")
    lines.pop()  # the text after the last newline: b"" or a torn write
    return [line for line in lines if line.strip()]


def _parse(lines: list[bytes], path: Path) -> list[dict[str, Any]]:
    records = []
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{number}: not a JSON line ({e}); the file is corrupt "
                             "beyond a torn last line") from None
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            raise ValueError(f"{path}:{number}: a metrics line must be an object with an "
                             "integer 'step'")
        records.append(record)
    return records


def read_metrics(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of ``run_dir/metrics.jsonl`` in file order (``null`` = non-finite).

    ``run_dir`` may also be the path of a ``.jsonl`` file. A torn last line
    (a partial write without its newline, left by a ``kill -9``) is ignored;
    a malformed line elsewhere raises :class:`ValueError`.
    """
    path = _metrics_path(run_dir)
    if not path.is_file():
        raise FileNotFoundError(f"no {path.name} in {path.parent} (is it a sao-gym run dir?)")
    return _parse(_complete_lines(path.read_bytes()), path)


def _atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` by ``data``: temp file, fsync, rename, fsync the directory."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_path(path.parent)


def _json_value(key: str, value: Any) -> tuple[Any, bool]:
    """``(JSON-ready value, was_nonfinite)`` for one metric value."""
    if value is None or isinstance(value, (str, bool, int)):
        return value, False
    if hasattr(value, "item") and not isinstance(value, float):  # numpy / torch scalars
        try:
            value = value.item()
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"metric {key!r}: {type(value).__name__} is not a scalar") from None
        if isinstance(value, (bool, int)):
            return value, False
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"metric {key!r}: {type(value).__name__} is not a number") from None
    return (number, False) if math.isfinite(number) else (None, True)


class JsonlLogger(_ContextMixin):
    """Appends ``{"step": step, **metrics}`` lines to ``run_dir/metrics.jsonl``.

    Every line is flushed and fsynced before :meth:`log` returns. With
    ``resume_step=N`` the existing file is first rewritten atomically to hold
    exactly the steps ``<= N``, each once and in step order (later lines and a
    torn last line are dropped). Without it an existing file must hold no
    complete record (a fresh run never mixes with an old one).

    Log a step's metrics *before* writing that step's checkpoint: then a run
    resumed from its last checkpoint finds every step up to it in the file.
    """

    def __init__(self, run_dir: str | os.PathLike[str], *, resume_step: int | None = None):
        self.path = Path(run_dir) / METRICS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.last_step: int | None = None
        """The last step in the file (after repair), or None."""
        self.nonfinite_counts: dict[str, int] = {}
        """Non-finite values written (as null) so far, per metric name."""
        self.last_nonfinite: tuple[str, ...] = ()
        """Names of the metrics of the last :meth:`log` call that were non-finite."""
        self._repair(resume_step)
        self._file = open(self.path, "ab")

    def _repair(self, resume_step: int | None) -> None:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        records = _parse(_complete_lines(data), self.path)
        if resume_step is None:
            if records:
                raise FileExistsError(
                    f"{self.path} already holds {len(records)} steps; pass resume_step to "
                    "continue that run or use a new run dir")
            kept: list[dict[str, Any]] = []
        else:
            by_step = {r["step"]: r for r in records if r["step"] <= resume_step}  # last wins
            kept = [by_step[s] for s in sorted(by_step)]
        out = b"".join(json.dumps(r, allow_nan=False).encode() + b"\n" for r in kept)
        if out != data:
            _log.info("metrics.jsonl: kept %d of %d lines (resume_step=%s)",
                      len(kept), len(records), resume_step)
            _atomic_write(self.path, out)
        self.last_step = kept[-1]["step"] if kept else None
        if resume_step is not None and (self.last_step or 0) < resume_step:
            _log.warning("%s ends at step %s but the run resumes after step %d: those steps "
                         "have no metrics", self.path, self.last_step, resume_step)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Append one fsynced line; non-finite values become ``null`` and are counted."""
        if self._file.closed:
            raise ValueError("log() on a closed JsonlLogger")
        step = int(step)
        if self.last_step is not None and step <= self.last_step:
            raise ValueError(f"step {step} logged after step {self.last_step}: steps must "
                             "strictly increase")
        if "step" in metrics and metrics["step"] != step:
            raise ValueError(f"metrics carry step={metrics['step']!r} but step={step}")
        record: dict[str, Any] = {"step": step}
        bad = []
        for key, value in metrics.items():
            if key != "step":
                record[key], nonfinite = _json_value(key, value)
                if nonfinite:
                    bad.append(key)
        for key in bad:  # counted only once the whole record converted
            self.nonfinite_counts[key] = self.nonfinite_counts.get(key, 0) + 1
        self.last_nonfinite = tuple(bad)
        self._file.write(json.dumps(record, allow_nan=False).encode() + b"\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        self.last_step = step

    def close(self) -> None:
        """Close the file (every line is already on disk)."""
        self._file.close()


# ---------------------------------------------------------------------------
# Optional mirrors


def _missing_extra(package: str, extra: str) -> ImportError:
    return ImportError(f"the {extra!r} logger needs the {package!r} package: "
                       f"pip install 'sao-gym[{extra}]'")


def _numeric(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The numeric entries of ``metrics`` as floats (strings and None are left out)."""
    out = {}
    for key, value in metrics.items():
        if value is None or isinstance(value, str):
            continue
        try:
            out[key] = float(value)
        except (TypeError, ValueError):
            continue
    return out


class TensorBoardLogger(_ContextMixin):
    """Scalars in ``run_dir/tensorboard`` through ``torch.utils.tensorboard``.

    On resume (``resume_step=N``) the new event file purges the old events of
    steps ``> N`` when TensorBoard reads the directory.
    """

    def __init__(self, run_dir: str | os.PathLike[str], *, resume_step: int | None = None,
                 flush_secs: int = 30):
        try:
            import tensorboard  # noqa: F401 - torch's import error does not name the extra
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise _missing_extra("tensorboard", "tensorboard") from None
        self.log_dir = Path(run_dir) / "tensorboard"
        purge_step = None if resume_step is None else resume_step + 1
        self._writer = SummaryWriter(str(self.log_dir), purge_step=purge_step,
                                     flush_secs=flush_secs)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Add every numeric metric as a scalar at ``step``."""
        for key, value in _numeric(metrics).items():
            self._writer.add_scalar(key, value, global_step=int(step))

    def close(self) -> None:
        """Flush and close the event file."""
        self._writer.close()


@contextmanager
def _environ(defaults: Mapping[str, str], forced: Mapping[str, str]) -> Iterator[None]:
    """Set ``defaults`` where unset and ``forced`` always; restore everything afterwards."""
    saved = {k: os.environ.get(k) for k in [*defaults, *forced]}
    os.environ.update({k: v for k, v in defaults.items() if k not in os.environ})
    os.environ.update(forced)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class WandbLogger(_ContextMixin):
    """Weights & Biases, offline by default: files under ``run_dir/wandb``, no network.

    Offline mode needs no login and never prompts; ``wandb sync
    RUN_DIR/wandb/offline-run-*`` uploads later. W&B's config, cache and data
    directories default to ``run_dir/wandb/.home`` while the run starts, so
    nothing is written outside ``run_dir`` (variables already set are kept).
    Each start or resume is its own W&B run in group ``run_dir``'s name, with
    ``resume_step`` in its config; ``metrics.jsonl`` stays the source of truth.
    """

    def __init__(self, run_dir: str | os.PathLike[str], *, project: str = "sao-gym",
                 config: Mapping[str, Any] | None = None, mode: str = "offline",
                 name: str | None = None, resume_step: int | None = None):
        try:
            import wandb
        except ImportError:
            raise _missing_extra("wandb", "wandb") from None
        run_dir = Path(run_dir).resolve()
        home = run_dir / "wandb" / ".home"
        home.mkdir(parents=True, exist_ok=True)
        env = {"WANDB_CONFIG_DIR": str(home / "config"), "WANDB_CACHE_DIR": str(home / "cache"),
               "WANDB_DATA_DIR": str(home / "data"), "WANDB_ARTIFACT_DIR": str(home / "artifacts")}
        settings = wandb.Settings(console="off", silent=True, save_code=False)
        run_config = {**(config or {}), "resume_step": resume_step}
        # WANDB_MODE also reaches W&B's process-wide settings, which decide whether
        # its own usage telemetry is sent (offline: never).
        forced = {"WANDB_MODE": mode} if mode in ("offline", "disabled") else {}
        with _environ(env, forced):
            self._run = wandb.init(project=project, dir=str(run_dir), mode=mode,
                                   config=run_config, name=name, group=run_dir.name,
                                   settings=settings)
        self.run_dir = Path(self._run.dir).parent
        """This W&B run's own directory (``run_dir/wandb/offline-run-...``)."""
        self._closed = False

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Log the numeric metrics at ``step``."""
        self._run.log(_numeric(metrics), step=int(step))

    def close(self) -> None:
        """Finish the W&B run (writes its summary); idempotent."""
        if not self._closed:
            self._closed = True
            self._run.finish()


# ---------------------------------------------------------------------------
# Fan-out


class FanoutLogger(_ContextMixin):
    """Sends each step to several loggers; the JSONL one first and strictly.

    An optional logger (TensorBoard, W&B) that raises is reported once and
    dropped, so a mirror cannot stop a training run; JSONL errors propagate.
    """

    def __init__(self, jsonl: JsonlLogger, others: Sequence[MetricLogger] = ()):
        self.jsonl = jsonl
        """The :class:`JsonlLogger` (``nonfinite_counts``, ``last_nonfinite``, ``last_step``)."""
        self.others = list(others)
        """The optional loggers still active."""

    @property
    def loggers(self) -> list[MetricLogger]:
        """Every active logger, JSONL first."""
        return [self.jsonl, *self.others]

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Log to JSONL, then to each optional logger."""
        self.jsonl.log(step, metrics)
        for metric_logger in list(self.others):
            try:
                metric_logger.log(step, metrics)
            except Exception:  # noqa: BLE001 - a mirror must not stop training
                _log.exception("%s failed at step %d; it is disabled for the rest of the run",
                               type(metric_logger).__name__, step)
                self.others.remove(metric_logger)

    def close(self) -> None:
        """Close every logger, then raise the first error if any."""
        errors = []
        for metric_logger in self.loggers:
            try:
                metric_logger.close()
            except Exception as e:  # noqa: BLE001 - close the others first
                errors.append(e)
        if errors:
            raise errors[0]


def make_loggers(names: str | Sequence[str], run_dir: str | os.PathLike[str], *,
                 config: Mapping[str, Any] | None = None,
                 resume_step: int | None = None,
                 wandb_project: str = "sao-gym") -> FanoutLogger:
    """The loggers named in ``names`` (comma-separated or a list), JSONL always included.

    ``config`` is recorded by W&B; ``resume_step`` is passed to every logger
    (see :class:`JsonlLogger`). Unknown names raise :class:`ValueError`.
    """
    if isinstance(names, str):
        names = names.split(",")
    wanted = [n.strip().lower() for n in names if n.strip()]
    unknown = sorted(set(wanted) - set(LOGGER_NAMES))
    if unknown:
        raise ValueError(f"unknown logger(s) {', '.join(map(repr, unknown))}; "
                         f"valid: {', '.join(LOGGER_NAMES)}")
    jsonl = JsonlLogger(run_dir, resume_step=resume_step)
    others: list[MetricLogger] = []
    try:
        if "tensorboard" in wanted:
            others.append(TensorBoardLogger(run_dir, resume_step=resume_step))
        if "wandb" in wanted:
            others.append(WandbLogger(run_dir, project=wandb_project, config=config,
                                      resume_step=resume_step))
    except BaseException:
        for metric_logger in [jsonl, *others]:
            metric_logger.close()
        raise
    return FanoutLogger(jsonl, others)
