"""The viewer as a user runs it (``sao-gym view`` in a subprocess) and headless Chromium.

:class:`Viewer` starts ``sao-gym view`` on a free port and waits until it
answers; :func:`chromium` starts Debian's chromium through its chromedriver
(Selenium, offline: no driver or browser download), headless, with the
browser console recorded. :func:`hostile_run` writes a run directory whose
rollouts carry markup and script in every string a model or an
environment controls.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from sao_gym.rollout_store import RolloutWriter, rollout_record
from sao_gym.types import Rollout, StopReason

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"

TINY_RUN = ["--set", "env=sao_gym/Arithmetic-v0", "--set", "warm_start=null",
            "--set", "rollout.max_new_tokens=12", "--set", "rollout.max_episode_steps=3",
            "--set", "rollout.max_context_tokens=1024", "--set", "learner.critic_warmup_steps=0"]
"""`sao-gym train` settings of a quick run of the tiny model (no warm start)."""

HOSTILE = ['<script>window.__pwned = 1</script>',
           '<img src=x onerror="window.__pwned = 2">',
           '<a href="javascript:window.__pwned = 3">click</a>',
           'javascript:window.__pwned = 4']
"""Strings that would run script if a page put them in as markup."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Viewer:
    """``sao-gym view RUN_DIR...`` on a free port of 127.0.0.1 (a context manager)."""

    def __init__(self, *run_dirs: Path, host: str = "127.0.0.1"):
        self.port = free_port()
        self.host = host
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sao_gym.cli", "view", *map(str, run_dirs), "--port",
             str(self.port), "--host", host], cwd=ROOT, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"sao-gym view exited: {self.proc.stderr.read()[-2000:]}")
            try:
                urllib.request.urlopen(self.url + "/api/runs", timeout=2).read()
                return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if time.monotonic() > deadline:
                    self.close()
                    raise AssertionError("sao-gym view did not answer within 60 s") from None
                time.sleep(0.1)

    def get(self, path: str) -> tuple[int, dict[str, str], bytes]:
        """``(status, headers, body)`` of a GET of ``path`` exactly as written (no normalising)."""
        import http.client

        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request("GET", path)
            r = conn.getresponse()
            return r.status, dict(r.getheaders()), r.read()
        finally:
            conn.close()

    def json(self, path: str):
        status, _, body = self.get(path)
        assert status == 200, (path, status, body[:300])
        return json.loads(body)

    def close(self) -> str:
        """Stop the server; its stderr."""
        self.proc.terminate()
        try:
            _, err = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        return err

    def __enter__(self) -> Viewer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def chromium():
    """A headless Chromium (Selenium WebDriver); skips the test where there is none."""
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        pytest.skip("no chromium/chromedriver (`make test` installs them as root)")
    webdriver = pytest.importorskip("selenium.webdriver")
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager must not try to download anything
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1000", "--disable-extensions", "--no-first-run"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=opts,
                            service=webdriver.ChromeService(executable_path=CHROMEDRIVER))


def console_errors(driver) -> list[dict]:
    """The browser console's errors (and CSP violations) since the last call."""
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def hostile_rollout(i: int, big: int = 1 << 20) -> tuple[Rollout, list[str]]:
    """``(rollout, token texts)``: every string tries to run script.

    Episode 0 also has a ``big``-byte line.
    """
    bad = HOSTILE[i % len(HOSTILE)]
    messages = [{"role": "system", "content": f"system {bad}"},
                {"role": "user", "content": "\n".join(HOSTILE)},
                {"role": "assistant", "content": bad,
                 "tool_calls": [{"id": "c1", "type": "function",
                                 "function": {"name": f"tool{bad}", "arguments": json.dumps(
                                     {"x": bad})}}]},
                {"role": "tool", "tool_call_id": "c1", "name": "tool",
                 "content": bad + ("A" * big if i == 0 else "")}]
    texts = ["<|im_start|>", *HOSTILE, "ok", bad, "<|im_end|>"]
    n = len(texts)
    mask = [0, 0, 0, 0, 0, 1, 1, 0]
    return Rollout(token_ids=list(range(10, 10 + n)), loss_mask=mask,
                   rollout_logprobs=[-0.5 if m else 0.0 for m in mask],
                   policy_versions=[0 if m else -1 for m in mask], reward=float(i % 2),
                   terminated=True, truncated=False, stop_reason=StopReason.TERMINATED,
                   infra_failure=False, messages=messages, env_id=f"evil/{bad}",
                   task_id=f"task-{i}-{bad}", seed=i, metrics={"turns": 1.0},
                   segment_starts=[6] if i == 1 else []), texts  # episode 1: two segments


def hostile_run(run_dir: Path, episodes: int = 6) -> Path:
    """A run directory of :func:`hostile_rollout` s (split ``train``, traced) and metrics."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with RolloutWriter(run_dir, "train") as w:
        for i in range(episodes):
            r, texts = hostile_rollout(i)
            n = len(r.token_ids)
            learner = {"advantage": [0.25 * (k % 3) for k in range(n)],
                       "dis_mask": [1] * n, "ratio": [1.0] * n}
            w.write(rollout_record(r, split="train", step=i + 1, learner=learner,
                                   learner_step=i + 1, token_text=texts))
    rows = [{"step": s, "rollout/success_rate": s / 10, HOSTILE[1]: 1.0} for s in range(1, 4)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_dir
