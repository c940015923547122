"""Kept rollouts: records, segments, rotation, torn writes and a writer killed with SIGKILL."""

import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest

from sao_gym.rollout_store import (
    ROLLOUTS_DIR,
    RolloutReader,
    RolloutWriter,
    check_split,
    rollout_record,
)
from sao_gym.runtime.loop.recorder import RolloutRecorder
from sao_gym.types import Rollout, StopReason


def rollout(n_prompt=3, turns=2, reward=1.0, task="t0", infra=False, seed=7):
    ids, mask, lps, versions = list(range(1, n_prompt + 1)), [0] * n_prompt, [0.0] * n_prompt, \
        [-1] * n_prompt
    for t in range(turns):
        ids += [100 + t, 101 + t]
        mask += [1, 1]
        lps += [-0.123456789, -2.5]
        versions += [t, t]
        ids += [200 + t]
        mask += [0]
        lps += [0.0]
        versions += [-1]
    messages = [{"role": "user", "content": "go"}, {"role": "assistant", "content": "x"}]
    return Rollout(token_ids=ids, loss_mask=mask, rollout_logprobs=lps, policy_versions=versions,
                   reward=reward, terminated=not infra, truncated=False,
                   stop_reason=StopReason.ENV_ERROR if infra else StopReason.TERMINATED,
                   infra_failure=infra, messages=messages, env_id="test/Env-v0", task_id=task,
                   seed=seed, metrics={"turns": float(turns)})


def test_records_round_trip_with_rounded_floats_and_a_summary(tmp_path):
    r = rollout()
    n = len(r.token_ids)
    learner = {"advantage": [0.5] * n, "value": [math.nan] + [0.25] * (n - 1),
               "dis_mask": [1] * n}
    rec = rollout_record(r, split="train", step=3, learner=learner, learner_step=3,
                         token_text=[f"<{i}>" for i in r.token_ids])
    with RolloutWriter(tmp_path, "train") as w:
        assert w.write(rec) == 0 and w.write(rollout_record(r, split="train", step=4)) == 1
    reader = RolloutReader(tmp_path)
    assert reader.splits() == ["train"]
    first, second = reader.episodes("train")
    assert first["step"] == 3 and first["traced"] and not second["traced"]
    assert first["tokens"] == n and first["action_tokens"] == 4 and first["turns"] == 2
    assert first["reward"] == 1.0 and first["stop_reason"] == "terminated"
    back = reader.record("train", 0)
    assert back["id"] == 0 and back["task_id"] == "t0" and back["seed"] == 7
    assert back["tokens"]["sampler_logprob"][3] == -0.1235  # DECIMALS places
    assert back["learner"]["value"][0] is None  # JSON has no NaN
    assert back["learner"]["step"] == 3 and back["tokens"]["text"][0] == "<1>"
    assert reader.record("train", 2) is None and reader.record("train", -1) is None


def test_bad_input_is_refused_clearly(tmp_path):
    r = rollout()
    for bad in ("", "../x", "a/b", ".hidden", "x" * 65):
        with pytest.raises(ValueError, match="split name"):
            check_split(bad)
    with pytest.raises(ValueError, match="one value a token"):
        rollout_record(r, split="train", learner={"advantage": [0.0]})
    with pytest.raises(ValueError, match="unknown learner quantities"):
        rollout_record(r, split="train", learner={"nope": [0.0] * len(r.token_ids)})
    with pytest.raises(ValueError, match="token_text"):
        rollout_record(r, split="train", token_text=["a"])
    with pytest.raises(ValueError, match="segment_bytes"):
        RolloutWriter(tmp_path, "train", segment_bytes=100, max_bytes=10)


def test_a_torn_tail_is_invisible_and_the_next_writer_starts_a_new_segment(tmp_path):
    with RolloutWriter(tmp_path, "train") as w:
        w.write_all(rollout_record(rollout(task=f"t{i}"), split="train") for i in range(3))
    split = tmp_path / ROLLOUTS_DIR / "train"
    with open(split / "000001.jsonl", "ab") as f:  # a record cut mid-write ...
        f.write(b'{"id": 3, "split": "tr')
    with open(split / "000001.index.jsonl", "ab") as f:  # ... and an index line
        f.write(b'{"id": 3, "seg": 1, "off": 99')
    reader = RolloutReader(tmp_path)
    assert [e["id"] for e in reader.episodes("train")] == [0, 1, 2]
    with RolloutWriter(tmp_path, "train") as w:
        assert w.write(rollout_record(rollout(task="t3"), split="train")) == 3
    assert sorted(p.name for p in split.iterdir()) == [
        "000001.index.jsonl", "000001.jsonl", "000002.index.jsonl", "000002.jsonl"]
    assert [e["id"] for e in reader.episodes("train")] == [0, 1, 2, 3]  # read on
    assert reader.record("train", 3)["task_id"] == "t3"
    # an index entry pointing past its data file's end (data lost) reads as missing
    with open(split / "000002.index.jsonl", "ab") as f:
        f.write(json.dumps({"id": 4, "seg": 2, "off": 10**6, "len": 50}).encode() + b"\n")
    assert reader.record("train", 4) is None


def test_rotation_bounds_a_split_and_ids_go_on(tmp_path):
    one = len(json.dumps(rollout_record(rollout(), split="train")))
    with RolloutWriter(tmp_path, "train", segment_bytes=3 * one, max_bytes=9 * one) as w:
        reader = RolloutReader(tmp_path)
        for i in range(40):
            w.write(rollout_record(rollout(task=f"t{i}"), split="train"))
            if i % 7 == 0:
                reader.episodes("train")  # read while rotating
            split = tmp_path / ROLLOUTS_DIR / "train"
            assert sum(p.stat().st_size for p in split.iterdir()) <= 9 * one * 1.2  # + index
    ids = [e["id"] for e in reader.episodes("train")]
    assert ids == list(range(ids[0], 40)) and 0 < ids[0] and len(ids) >= 6
    assert all(reader.record("train", i)["task_id"] == f"t{i}" for i in ids)
    with RolloutWriter(tmp_path, "train", segment_bytes=3 * one, max_bytes=9 * one) as w:
        assert w.write(rollout_record(rollout(), split="train")) == 40


WRITER = """
import sys
from sao_gym.rollout_store import RolloutWriter, rollout_record
from tests.runtime.test_rollout_store import rollout
w = RolloutWriter(sys.argv[1], "train", segment_bytes=200_000, max_bytes=None)
i = 0
while True:
    r = rollout(n_prompt=2000 + i % 500, task=f"t{i}")
    w.write(rollout_record(r, split="train", token_text=["x"] * len(r.token_ids)))
    i += 1
    if i == 5:
        print("going", flush=True)
"""


@pytest.mark.parametrize("delay", [0.05, 0.2, 0.45])
def test_a_writer_killed_with_sigkill_leaves_every_indexed_record_readable(tmp_path, delay):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], cwd=root,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "going"
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    reader = RolloutReader(tmp_path)
    entries = reader.episodes("train")
    assert len(entries) >= 5
    assert [e["id"] for e in entries] == list(range(len(entries)))
    for e in entries:
        rec = reader.record("train", e["id"])
        assert rec is not None and rec["task_id"] == f"t{e['id']}"
    with RolloutWriter(tmp_path, "train") as w:  # and writing goes on after it
        assert w.write(rollout_record(rollout(), split="train")) == len(entries)


class _FullDisk:
    split = "train"

    def write_all(self, records):
        list(records)
        raise OSError(28, "No space left on device")

    def close(self):
        pass


def test_the_recorder_keeps_a_seeded_sample_and_every_failure(tmp_path):
    batch = [rollout(task=f"t{i}") for i in range(8)]
    with RolloutWriter(tmp_path, "train") as w:
        rec = RolloutRecorder(w, per_step=3, seed=5)
        picked = rec.pick(1, batch)
        assert picked == rec.pick(1, batch) and len(picked) == 3 and picked == sorted(picked)
        assert RolloutRecorder(w, per_step=20).pick(1, batch) == list(range(8))
        assert RolloutRecorder(w, per_step=0).pick(1, batch) == []
        n = len(batch[0].token_ids)
        trace = {i: {"advantage": [float(i)] * n} for i in picked}
        failed = rollout(task="broken", infra=True)
        assert rec.record(1, batch, trace, [failed]) == 4
    entries = RolloutReader(tmp_path).episodes("train")
    assert [e["task_id"] for e in entries] == [f"t{i}" for i in picked] + ["broken"]
    assert [e["traced"] for e in entries] == [True, True, True, False]
    assert entries[-1]["infra_failure"] and entries[-1]["stop_reason"] == "env_error"
    full = RolloutRecorder(_FullDisk(), per_step=1)
    assert full.record(2, batch, {0: {"advantage": [0.0] * n}}) == 0  # logged, not raised
    assert full.failed_writes == 1


def test_pages_counts_and_values_read_only_what_they_need(tmp_path):
    sly = 'x","stop_reason":"forged'  # a task id holding the text of another field
    with RolloutWriter(tmp_path, "train") as w:
        for i in range(30):
            r = rollout(task=sly if i == 7 else f"t{i}", infra=i % 10 == 3)
            w.write(rollout_record(r, split="train", step=i))
    split = tmp_path / ROLLOUTS_DIR / "train"
    with open(split / "000001.index.jsonl", "ab") as f:
        f.write(b"not json\n")  # a malformed line: skipped wherever it is read
    with RolloutWriter(tmp_path, "train") as w:
        w.write(rollout_record(rollout(task="after"), split="train", step=30))
    reader = RolloutReader(tmp_path)
    assert reader.count("train") == 32  # lines, the malformed one (not parsed yet) included
    assert [e["id"] for e in reader.page("train", 0, 3)] == [0, 1, 2]
    assert [e["id"] for e in reader.page("train", 0, 3, reverse=True)] == [30, 29, 28]
    assert reader.count("train") == 31  # parsed now, the malformed line is dropped
    state = reader._splits["train"]
    assert sum(p is not None for p in state.parsed) == 6  # nothing else was parsed
    assert reader.values("train", "stop_reason") == ["env_error", "terminated"]
    assert sly in reader.values("train", "task_id")
    assert sum(p is not None for p in state.parsed) == 6  # values parse no line
    assert reader.entry("train", 7)["task_id"] == sly
    assert reader.entry("train", 30)["task_id"] == "after"  # past the malformed line
    assert reader.entry("train", 31) is None
    assert [e["id"] for e in reader.episodes("train")] == list(range(31))


def test_a_rotated_split_still_finds_entries_by_id(tmp_path):
    one = len(json.dumps(rollout_record(rollout(), split="train")))
    with RolloutWriter(tmp_path, "train", segment_bytes=2 * one, max_bytes=4 * one) as w:
        reader = RolloutReader(tmp_path)
        for i in range(12):
            w.write(rollout_record(rollout(task=f"t{i}"), split="train"))
            reader.count("train")
    ids = [e["id"] for e in reader.episodes("train")]
    assert ids[0] > 0 and ids == list(range(ids[0], 12))
    assert reader.entry("train", ids[0])["task_id"] == f"t{ids[0]}"
    assert reader.entry("train", ids[0] - 1) is None
    assert reader.values("train", "task_id") == sorted(f"t{i}" for i in ids)
