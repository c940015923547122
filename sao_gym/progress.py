"""A live view of a training run for the console.

:class:`ProgressDisplay` shows the latest learner step's metrics. On a
terminal it is a Rich live panel (step/total, reward, success, throughput,
staleness, queue depth, losses, elapsed time and ETA), refreshed in place.
Anywhere else (a log file, CI, ``nohup``) it prints one plain summary line at
most every ``plain_interval_s`` seconds, plus the last step, to stderr.

Values are read by metric name (see ``docs/metrics.md``); a missing key shows
as ``-`` and odd values (nan, None, strings) are shown, never raised on.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

__all__ = ["ProgressDisplay", "format_duration", "format_value"]

ETA_WINDOW_STEPS = 20
"""Recent steps whose mean duration the ETA is computed from."""

# (label, metric key, format) shown in the panel and the plain line, in order.
_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("return", "rollout/return_mean", ".3f"),
    ("success", "rollout/success_rate", ".1%"),
    ("traj/s", "perf/trajectories_per_s", ".2f"),
    ("tok/s", "perf/tokens_per_s", ",.0f"),
    ("stale mean", "async/staleness_mean", ".2f"),
    ("stale max", "async/staleness_max", ".0f"),
    ("queue", "async/queue_depth", ".0f"),
    ("in flight", "async/in_flight", ".0f"),
    ("policy loss", "loss/policy", ".4g"),
    ("clip ratio", "sao/clip_ratio", ".2e"),
    ("expl. var", "critic/explained_variance", ".3f"),
)


def format_value(value: Any, spec: str = ".4g") -> str:
    """``value`` formatted with ``spec``; ``-`` for None, the text for strings, never raises."""
    if value is None:
        return "-"
    if isinstance(value, str):
        return value[:16] or "-"
    try:
        number = float(value)
    except (TypeError, ValueError, RuntimeError):
        return "-"
    if math.isnan(number):
        return "nan"
    if math.isinf(number):
        return "inf" if number > 0 else "-inf"
    try:
        return format(number, spec)
    except ValueError:
        return format(number, ".4g")


def format_duration(seconds: float | None) -> str:
    """``1h02m03s``, ``2m05s`` or ``45s``; ``-`` when unknown."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "-"
    total = int(round(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


class ProgressDisplay:
    """The console view of a run of ``total_steps`` learner steps.

    Args:
        total_steps: the step the run ends at (for the bar and the ETA).
        console: where to draw; default a Rich console on stderr. Live mode
            when ``console.is_terminal``, plain lines otherwise.
        plain_interval_s: least seconds between two plain lines.
        initial_step: the step the run starts after (a resumed run's
            checkpoint step), so the ETA uses only this session's steps.
        clock: seconds, monotonic (injected by tests).
        refresh_per_second: redraws of the live panel.

    The ETA is the steps left times the mean duration of the last
    :data:`ETA_WINDOW_STEPS` steps, not counting the session's first step
    once there are others: that one carries the start-up (the first
    episodes, compilation), which a mean over the whole session spreads over
    every step left (a 39 s run read 5m38s). Between steps the ETA counts
    down by at most one step.

    Use as a context manager, or call :meth:`close` at the end.

    """

    def __init__(self, total_steps: int, *, console: Console | None = None,
                 plain_interval_s: float = 10.0, initial_step: int = 0,
                 clock: Callable[[], float] = time.monotonic,
                 refresh_per_second: float = 2.0, title: str = "sao-gym train"):
        self.total_steps = max(int(total_steps), 0)
        self.console = console if console is not None else Console(stderr=True)
        self.plain_interval_s = plain_interval_s
        self.initial_step = initial_step
        self.title = title
        self._clock = clock
        self._refresh_per_second = refresh_per_second
        self._start = clock()
        self._step: int | None = None
        # (step, clock) of this session's updates: the first is the end of the start-up step
        self._marks: deque[tuple[int, float]] = deque(maxlen=ETA_WINDOW_STEPS + 1)
        self._metrics: Mapping[str, Any] = {}
        self._live: Live | None = None
        self._last_line_at: float | None = None
        self._line_pending = False
        self._closed = False

    @property
    def live(self) -> bool:
        """Whether the display is a Rich live panel (the console is a terminal)."""
        return self.console.is_terminal

    def __enter__(self) -> ProgressDisplay:
        if self.live:
            self._start_live()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start_live(self) -> None:
        if self._live is None and not self._closed:
            self._live = Live(console=self.console, get_renderable=self.render,
                              refresh_per_second=self._refresh_per_second)
            self._live.start()

    def update(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Show ``metrics`` of learner step ``step``."""
        if self._closed:
            return
        try:
            self._step = int(step)
        except (TypeError, ValueError):
            self._step = None
        self._metrics = dict(metrics) if isinstance(metrics, Mapping) else {}
        self._mark(self._clock())
        if self.live:
            self._start_live()
            if self._live is not None:
                self._live.refresh()
            return
        now = self._clock()
        last_step = self._step is not None and self._step >= self.total_steps
        due = self._last_line_at is None or now - self._last_line_at >= self.plain_interval_s
        if due or last_step:
            self._write_line(now)
        else:
            self._line_pending = True

    def begin(self, initial_step: int = 0) -> None:
        """Start the clock now: the run's steps start after ``initial_step``.

        Call it when training starts, so set-up (model building, a warm start,
        evaluation) does not count in the rate the ETA is computed from.
        """
        self._start = self._clock()
        self.initial_step = int(initial_step)
        self._marks.clear()

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """:meth:`update` under the metric-sink name (the trainer's sinks call ``log``)."""
        self.update(step, metrics)

    def close(self) -> None:
        """Stop the live panel, or print the last step's line if it was held back."""
        if self._closed:
            return
        self._closed = True
        if self._live is not None:
            self._live.stop()
        elif self._line_pending:
            self._write_line(self._clock())

    # -- what is shown ------------------------------------------------------

    def _mark(self, now: float) -> None:
        """Note when the latest step ended (a step that went back starts the window again)."""
        if self._step is None:
            return
        if self._marks and self._step < self._marks[-1][0]:
            self._marks.clear()
        if not self._marks or self._step > self._marks[-1][0]:
            self._marks.append((self._step, now))

    def _seconds_per_step(self) -> float | None:
        """Mean seconds per step of the recent steps (the class docs), or None before any."""
        if len(self._marks) >= 2:  # the window starts where the first step ended
            (first, t0), (last, t1) = self._marks[0], self._marks[-1]
        elif self._marks:  # the first step alone: all we know
            (first, t0), (last, t1) = (self.initial_step, self._start), self._marks[-1]
        else:
            return None
        if last <= first or t1 <= t0:  # no time measured yet
            return None
        return (t1 - t0) / (last - first)

    def _timing(self, now: float) -> tuple[float, float | None]:
        """(elapsed seconds, ETA seconds or None) of this session."""
        elapsed = max(now - self._start, 0.0)
        if self._step is None:
            return elapsed, None
        remaining = self.total_steps - self._step
        if remaining <= 0:
            return elapsed, 0.0
        per_step = self._seconds_per_step()
        if per_step is None:
            return elapsed, None
        since_last = max(now - self._marks[-1][1], 0.0)
        return elapsed, max(remaining * per_step - min(since_last, per_step), 0.0)

    def _step_text(self) -> str:
        return f"{'-' if self._step is None else self._step}/{self.total_steps}"

    def plain_line(self, now: float | None = None) -> str:
        """The one-line summary of the latest update."""
        elapsed, eta = self._timing(self._clock() if now is None else now)
        parts = [f"step {self._step_text()}"]
        parts += [f"{label} {format_value(self._metrics.get(key), spec)}"
                  for label, key, spec in _FIELDS]
        parts += [f"elapsed {format_duration(elapsed)}", f"ETA {format_duration(eta)}"]
        return " | ".join(parts)

    def _write_line(self, now: float) -> None:
        stream = self.console.file
        stream.write(self.plain_line(now) + "\n")
        stream.flush()
        self._last_line_at = now
        self._line_pending = False

    def render(self) -> Panel:
        """The Rich panel of the latest update."""
        elapsed, eta = self._timing(self._clock())
        done = 0 if self._step is None else min(max(self._step, 0), self.total_steps)
        header = Table.grid(padding=(0, 2))
        header.add_row(Text(f"step {self._step_text()}", style="bold"),
                       ProgressBar(total=max(self.total_steps, 1), completed=done, width=30),
                       Text(f"elapsed {format_duration(elapsed)}"),
                       Text(f"ETA {format_duration(eta)}", style="cyan"))
        table = Table.grid(padding=(0, 3))
        for _ in range(3):
            table.add_column(justify="left")
            table.add_column(justify="right", style="bold")
        cells = [(label, format_value(self._metrics.get(key), spec))
                 for label, key, spec in _FIELDS]
        for i in range(0, len(cells), 3):
            row = cells[i:i + 3] + [("", "")] * (3 - len(cells[i:i + 3]))
            table.add_row(*(item for pair in row for item in pair))
        return Panel(Group(header, table), title=self.title, expand=False)
