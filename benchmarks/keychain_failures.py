"""How KeyChain episodes end, from a run's kept rollouts: solved, or where they failed.

    python benchmarks/keychain_failures.py RUN_DIR [--split train] [--every 10] [--json OUT]

Each kept episode of the split is put in one class:

- ``solved``;
- ``wrong last key``: the chain was complete and ``submit`` had another key;
- ``never submitted``: the chain was complete, and the episode ran out of turns
  (``lookup`` after the end, answered "the chain is complete. Submit ...");
- ``out of turns mid-chain``: miscopies spent the turn budget before the end;
- ``submitted early``: ``submit`` before the chain was complete.

For the ``train`` split (a sample of each learner step's batch) the classes
are counted per window of ``--every`` steps, so a collapse shows which kind of
failure took over; ``--json`` writes the per-episode classes.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

CLASSES = ("solved", "wrong last key", "never submitted", "out of turns mid-chain",
           "submitted early")


def classify(record: dict) -> dict:
    """The class of one kept episode (a rollout-store record) and its counts."""
    obs = [m["content"] or "" for m in record["messages"] if m["role"] in ("tool", "user")][1:]
    complete = any("the last key is" in o for o in obs)
    if record["reward"] >= 1:
        how = "solved"
    elif record["truncated"]:
        how = "never submitted" if complete else "out of turns mid-chain"
    elif obs and obs[-1].startswith("Incorrect: the chain"):
        how = "submitted early"
    else:
        how = "wrong last key"
    return {"step": record.get("step"), "seed": record.get("seed"), "how": how,
            "turns": sum(m["role"] == "assistant" for m in record["messages"]),
            "miscopies": sum(o.startswith("Error: no key") for o in obs),
            "lookups_after_complete": sum("chain is complete" in o for o in obs),
            "no_tool_call": sum(o.startswith("Error: no tool call") for o in obs)}


def episodes(run: Path, split: str) -> list[dict]:
    from sao_gym.rollout_store import RolloutReader

    return [classify(r) for r in RolloutReader(run).records(split)]


def table(rows: list[dict], every: int | None) -> str:
    def key(r: dict) -> str:
        if every is None or r["step"] is None:
            return "all"
        first = (r["step"] - 1) // every * every + 1
        return f"{first}-{first + every - 1}"

    groups: dict[str, collections.Counter] = {}
    for r in rows:
        groups.setdefault(key(r), collections.Counter())[r["how"]] += 1
    lines = ["| steps | episodes | " + " | ".join(CLASSES) + " |",
             "|---" * (len(CLASSES) + 2) + "|"]
    for name, counts in groups.items():
        n = sum(counts.values())
        lines.append(f"| {name} | {n} | " + " | ".join(f"{counts[c] / n:.2f}" for c in CLASSES)
                     + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", type=Path)
    p.add_argument("--split", default="train")
    p.add_argument("--every", type=int, default=10, help="learner steps per row (train)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    rows = episodes(args.run, args.split)
    print(table(rows, args.every if args.split == "train" else None))
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
