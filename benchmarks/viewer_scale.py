"""How fast `sao-gym view` answers on a run with 100,000 kept rollouts, and what they cost on disk.

Builds (once) a run directory whose ``train`` split holds ``--rollouts`` records
written by :class:`~sao_gym.rollout_store.RolloutWriter` (multi-turn, every
per-token quantity of a traced training rollout, token text included; most
``--tokens`` tokens long, one of ``--long-tokens``) and a metrics.jsonl of
1,000 steps. Then, ``--repeats`` times, starts a fresh ``sao-gym view`` (a
cold index) and measures:

- the API: the first page of the episode list (the first request, which reads
  the whole index), the same page again, and the long episode's record;
- headless Chromium (Debian's, through Selenium): from navigation to the page
  being drawn (``main[data-ready]``) for the episode list's first page and the
  long episode's page (4,000 spans coloured by advantage), as WebDriver sees it
  (``browser_*``: its polling included) and as the page's own clock says
  (``in_page_*``: ``performance.now()`` when drawn, from the navigation's start).

Medians and the spread are printed and written to ``OUT/summary.json``, with
the measured bytes per token of the records; ``--json PATH`` also writes them
with every repeat's times (seconds), the settings and how the script ran
(``_record.py``).

    .venv/bin/python benchmarks/viewer_scale.py --out runs/viewer-scale --repeats 7 \
        --json docs/data/viewer_scale.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _record import write_record  # noqa: E402

from sao_gym.rollout_store import ROLLOUTS_DIR, RolloutReader, RolloutWriter  # noqa: E402
from sao_gym.types import Rollout, StopReason  # noqa: E402

WORDS = ["lookup", "(", ")", "481", "7", "key", " the", " value", "\n", "submit", ":", " is",
         "<|im_start|>", "assistant", "tool", "{", "}", '"', "42", " next"]


def make_record(i: int, tokens: int, rng: random.Random) -> dict:
    """A traced multi-turn training record of ``tokens`` tokens (turns of ~12 sampled, ~20 not)."""
    from sao_gym.rollout_store import rollout_record

    mask = [0] * 40
    messages = [{"role": "system", "content": "Follow the chain."},
                {"role": "user", "content": f"Start at key {i}."}]
    while len(mask) < tokens:
        mask += [1] * 12 + [0] * 20
        call = {"id": f"c{len(messages)}", "type": "function", "function": {
            "name": "lookup", "arguments": json.dumps({"key": rng.randrange(9999)})}}
        messages += [{"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": call["id"], "name": "lookup",
                      "content": f"next key: {rng.randrange(9999)}"}]
    mask = mask[:tokens]
    n = len(mask)
    reward = float(rng.random() < 0.4)
    r = Rollout(token_ids=[rng.randrange(49152) for _ in range(n)], loss_mask=mask,
                rollout_logprobs=[-rng.expovariate(2.0) if m else 0.0 for m in mask],
                policy_versions=[i // 64 if m else -1 for m in mask], reward=reward,
                terminated=reward > 0 or rng.random() < 0.5, truncated=False,
                stop_reason=rng.choice([StopReason.TERMINATED, StopReason.MAX_TURNS]),
                infra_failure=False, messages=messages, env_id="sao_gym/KeyChain-v0",
                task_id=f"chain-{rng.randrange(10**6)}", seed=i,
                metrics={"turns": float(len(messages) // 2)})
    learner = {"logprob": [lp + rng.gauss(0, 0.01) for lp in r.rollout_logprobs],
               "ratio": [1.0 + rng.gauss(0, 0.02) if m else 0.0 for m in mask],
               "dis_mask": [int(m and rng.random() > 0.01) for m in mask],
               "advantage": [rng.gauss(0, 0.3) if m else 0.0 for m in mask],
               "value": [rng.random() if m else 0.0 for m in mask],
               "return": [reward if m else 0.0 for m in mask]}
    return rollout_record(r, split="train", step=i // 64 + 1, learner=learner,
                          learner_step=i // 64 + 1,
                          token_text=[rng.choice(WORDS) for _ in range(n)])


def build(run: Path, n: int, tokens: int, long_tokens: int) -> int:
    """The run directory (made once); the long episode's id."""
    long_id = n // 2
    if (run / "built.json").exists():
        return json.loads((run / "built.json").read_text())["long_id"]
    run.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    start = time.monotonic()
    with RolloutWriter(run, "train", max_bytes=None) as w:
        for i in range(n):
            w.write(make_record(i, long_tokens if i == long_id else tokens, rng))
            if i % 10_000 == 0:
                print(f"  {i} records written ({time.monotonic() - start:.0f} s)", flush=True)
    rows = [{"step": s, "rollout/success_rate": min(1.0, s / 1000 + rng.random() * 0.1),
             "rollout/return_mean": s / 1000, "critic/explained_variance": rng.random()}
            for s in range(1, 1001)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "built.json").write_text(json.dumps({"long_id": long_id, "rollouts": n}))
    return long_id


def storage(run: Path, long_id: int) -> dict:
    reader = RolloutReader(run)
    entries = reader.episodes("train")
    data = sum(p.stat().st_size for p in (run / ROLLOUTS_DIR / "train").glob("*.jsonl")
               if not p.name.endswith(".index.jsonl"))
    index = sum(p.stat().st_size for p in (run / ROLLOUTS_DIR / "train").glob("*.index.jsonl"))
    tokens = sum(e["tokens"] for e in entries)
    long_entry = reader.entry("train", long_id)
    return {"rollouts": len(entries), "tokens": tokens, "data_bytes": data,
            "index_bytes": index, "bytes_per_token": round(data / tokens, 1),
            "index_bytes_per_rollout": round(index / len(entries), 1),
            "long_rollout_tokens": long_entry["tokens"],
            "long_rollout_bytes_per_token": round(long_entry["len"] / long_entry["tokens"], 1)}


def measure(run: Path, long_id: int, repeats: int, browser: bool) -> dict[str, list[float]]:
    """Seconds of every repeat of each measurement (the browser's only with ``browser``)."""
    from tests.viewer.helpers import Viewer, chromium

    out: dict[str, list[float]] = {k: [] for k in (
        "api_first_page_cold_s", "api_first_page_warm_s", "api_long_episode_s",
        "browser_first_page_s", "browser_long_episode_s", "in_page_first_page_s",
        "in_page_long_episode_s")}
    driver = chromium() if browser else None
    try:
        for rep in range(repeats):
            with Viewer(run) as v:  # a fresh server: nothing of the index read yet
                for key, path in (("api_first_page_cold_s", "/api/runs/0/splits/train/episodes"),
                                  ("api_first_page_warm_s", "/api/runs/0/splits/train/episodes"),
                                  ("api_long_episode_s",
                                   f"/api/runs/0/splits/train/episodes/{long_id}")):
                    t = time.perf_counter()
                    status, _, body = v.get(path)
                    out[key].append(time.perf_counter() - t)
                    assert status == 200, body[:200]
                if driver is None:
                    continue
            with Viewer(run) as v:  # again cold, now through the browser
                for key, route in (("browser_first_page_s", "#/runs/0/train"),
                                   ("browser_long_episode_s", f"#/runs/0/train/{long_id}")):
                    driver.get("about:blank")
                    t = time.perf_counter()
                    driver.get(f"{v.url}/{route}")
                    while not driver.execute_script(
                            "return document.getElementById('main').dataset.ready "
                            "=== location.hash"):
                        time.sleep(0.005)
                    out[key].append(time.perf_counter() - t)
                    out[key.replace("browser_", "in_page_")].append(float(driver.execute_script(
                        "return document.getElementById('main').dataset.drawnMs")) / 1000)
                spans = driver.execute_script("return document.querySelectorAll('#strip span')"
                                              ".length")
                print(f"  repeat {rep + 1}: {spans} token spans drawn", flush=True)
    finally:
        if driver is not None:
            driver.quit()
    return {k: v for k, v in out.items() if v}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/viewer-scale", help="the run directory (made once)")
    p.add_argument("--rollouts", type=int, default=100_000)
    p.add_argument("--tokens", type=int, default=64, help="tokens of most rollouts")
    p.add_argument("--long-tokens", type=int, default=4000, help="tokens of the long one")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--no-browser", action="store_true", help="measure the API only")
    p.add_argument("--json", help="also write the summary and every repeat's times here")
    args = p.parse_args(argv)
    run = Path(args.out)
    long_id = build(run, args.rollouts, args.tokens, args.long_tokens)
    times = measure(run, long_id, args.repeats, not args.no_browser)
    summary = {"storage": storage(run, long_id), "timings": {
        k: {"median": round(statistics.median(v), 4), "min": round(min(v), 4),
            "max": round(max(v), 4), "n": len(v)} for k, v in times.items()}}
    print(json.dumps(summary, indent=2))
    (run / "summary.json").write_text(json.dumps(summary, indent=2))
    if args.json:
        write_record(args.json, {**summary, "times_s": times, "settings": {
            k: getattr(args, k) for k in ("rollouts", "tokens", "long_tokens", "repeats")}})


if __name__ == "__main__":
    main()
