"""One driver protocol for a learner's ranks: the local group's failure rules (fakes)."""

from __future__ import annotations

import pytest

from sao_gym.learner.ranks import ProcessRanks, RankDied, RankedLearner


class _Proc:
    def __init__(self, pid: int, alive: bool = True, exitcode: int | None = None):
        self.pid, self.alive, self.exitcode = pid, alive, exitcode
        self.joined = self.killed = False

    def is_alive(self) -> bool:
        return self.alive

    def join(self, timeout=None) -> None:
        self.joined = True

    def kill(self) -> None:
        self.killed, self.alive = True, False


class _Pipe:
    def __init__(self):
        self.sent = []

    def send(self, message) -> None:
        self.sent.append(message)


class _Learner:
    steps_done = 3

    def __init__(self):
        self.calls = []

    def update(self, rollouts, trace=None):
        self.calls.append(("update", rollouts))
        return {"loss": 1.0}


def test_mirrored_calls_reach_every_rank_and_answers_are_rank_0s():
    pipes = [_Pipe(), _Pipe()]
    driver = ProcessRanks(_Learner(), [(_Proc(11), pipes[0]), (_Proc(12), pipes[1])])
    learner = RankedLearner(driver)
    assert learner.update(["r"]) == {"loss": 1.0}
    assert [p.sent for p in pipes] == [[("update", (["r"],), {})]] * 2
    assert driver.learner.calls == [("update", ["r"])]
    assert learner.steps_done == 3  # not mirrored: rank 0's
    assert driver.pids[1:] == [11, 12]
    learner.close()
    assert [p.sent[-1] for p in pipes] == [None, None]  # each rank told to stop


def test_a_dead_rank_is_named_and_the_others_are_ended():
    alive, dead = _Proc(21), _Proc(22, alive=False, exitcode=-9)
    pipes = [_Pipe(), _Pipe()]
    driver = ProcessRanks(_Learner(), [(alive, pipes[0]), (dead, pipes[1])], run_dir="/r/run")
    with pytest.raises(RankDied, match=r"learner rank 2 \(pid 22\) died: exit code -9; "
                                       r"`sao-gym train --resume /r/run`"):
        RankedLearner(driver).update([])
    assert pipes[0].sent == [None] and alive.joined  # nothing sent but the stop
    assert driver.learner.calls == []
