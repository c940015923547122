"""``sao-gym view`` over HTTP: routes, 404 for anything outside the runs, 400s, headers; the
episode list's query against a brute-force reference."""

import random

import pytest

from sao_gym.cli import main
from sao_gym.viewer.query import SORT_KEYS, query
from tests.viewer.helpers import HOSTILE, Viewer, hostile_run


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return hostile_run(tmp_path_factory.mktemp("hostile") / "run")


def test_routes_answer_and_nothing_outside_the_runs_is_reachable(run):
    with Viewer(run) as v:
        runs = v.json("/api/runs")
        assert [(r["name"], r["splits"], r["steps"]) for r in runs] == [("run", ["train"], 3)]
        page = v.json("/api/runs/0/splits/train/episodes?size=2&sort=id&order=desc")
        assert page["total"] == 6 and [e["id"] for e in page["episodes"]] == [5, 4]
        status, headers, body = v.get("/api/runs/0/splits/train/episodes/0")
        assert status == 200 and headers["Content-Type"].startswith("application/json")
        assert len(body) > 1 << 20  # the record as stored, its 1 MB line included
        assert v.json("/api/runs/0/metrics?after=2")["rows"] == [
            {"step": 3, "rollout/success_rate": 0.3, HOSTILE[1]: 1.0}]
        status, headers, body = v.get("/")
        assert status == 200 and b"app.js" in body
        assert "script-src 'self'" in headers["Content-Security-Policy"]
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert v.get("/static/app.js")[0] == 200
        for path in ["/static/../server.py", "/static/%2e%2e/server.py",
                     "/static/..%2f..%2fcli.py", "/static/vendor/../../server.py",
                     "/../../etc/passwd", "/etc/passwd", "/api/runs/1/metrics",
                     "/api/runs/-1/metrics", "/api/runs/0/splits/..%2f/episodes",
                     "/api/runs/0/splits/..%2F..%2Fconfig.yaml/episodes",
                     "/api/runs/0/splits/nope/episodes", "/api/runs/0/splits/train/episodes/6",
                     "/api/runs/0/splits/train/episodes/..%2F..%2Fmetrics.jsonl",
                     "/api/runs/0/splits/train/episodes/-1", "/api/runs/0/metrics.jsonl",
                     "/metrics.jsonl", "/rollouts/train/000001.jsonl"]:
            status, headers, body = v.get(path)
            assert status == 404, (path, status, body[:200])
            assert b"root:" not in body and b"import" not in body
            assert headers["X-Content-Type-Options"] == "nosniff"
        for query_string, reason in [("sort=nope", b"sort must be one of"),
                                     ("size=0", b"size must be in"),
                                     ("reward_min=abc", b"reward_min must be a number"),
                                     ("truncated=maybe", b"truncated must be yes, no or any")]:
            status, _, body = v.get(f"/api/runs/0/splits/train/episodes?{query_string}")
            assert status == 400 and reason in body, (query_string, body)
        assert v.get("/api/runs/0/metrics?after=x")[0] == 400


def test_the_cli_refuses_bad_run_dirs_and_warns_off_loopback(run, tmp_path, capsys):
    assert main(["view", str(tmp_path / "nope")]) == 2
    assert "no such directory" in capsys.readouterr().err
    assert main(["view", str(tmp_path)]) == 2
    assert "is not a run directory" in capsys.readouterr().err
    loud = Viewer(run, host="0.0.0.0")
    assert "warning: serving on 0.0.0.0" in loud.close()
    quiet = Viewer(run)
    assert "warning" not in quiet.close()


def _entries(n, seed=0):
    rng = random.Random(seed)
    return [{"id": i, "seg": 1, "off": 0, "len": 1, "step": rng.randrange(1, 30),
             "reward": rng.choice([0.0, 0.5, 1.0, None]),
             "stop_reason": rng.choice(["terminated", "max_turns", "env_error"]),
             "env_id": rng.choice(["a/A-v0", "b/B-v0"]), "task_id": f"task{rng.randrange(50)}",
             "seed": rng.randrange(100), "truncated": rng.random() < 0.3,
             "infra_failure": rng.random() < 0.1, "traced": rng.random() < 0.5,
             "turns": float(rng.randrange(1, 9)), "tokens": rng.randrange(10, 5000),
             "action_tokens": rng.randrange(1, 900), "policy_version": rng.randrange(9),
             "time": rng.random()} for i in range(n)]


def test_the_query_matches_a_brute_force_reference():
    entries = _entries(600)
    rng = random.Random(1)
    for _ in range(200):
        params = {}
        if rng.random() < 0.5:
            params["step_min"] = str(rng.randrange(1, 30))
        if rng.random() < 0.3:
            params["step_max"] = str(rng.randrange(1, 30))
        if rng.random() < 0.4:
            params["reward_min"] = rng.choice(["0", "0.5", "1"])
        if rng.random() < 0.4:
            params["stop_reason"] = ",".join(rng.sample(["terminated", "max_turns",
                                                         "env_error"], rng.randint(1, 2)))
        if rng.random() < 0.3:
            params["env"] = "b/B-v0"
        if rng.random() < 0.3:
            params["task"] = f"task{rng.randrange(10)}"
        for flag in ("truncated", "infra", "traced"):
            if rng.random() < 0.3:
                params[flag] = rng.choice(["yes", "no", "any"])
        sort = rng.choice(SORT_KEYS)
        order = rng.choice(["asc", "desc"])
        size = rng.randint(1, 60)
        page = rng.randrange(4)
        got = query(entries, {**params, "sort": sort, "order": order, "size": str(size),
                              "page": str(page)})

        def keep(e, p=params):
            return ((("step_min" not in p) or e["step"] >= float(p["step_min"]))
                    and (("step_max" not in p) or e["step"] <= float(p["step_max"]))
                    and (("reward_min" not in p) or (e["reward"] is not None
                                                     and e["reward"] >= float(p["reward_min"])))
                    and (("stop_reason" not in p)
                         or e["stop_reason"] in p["stop_reason"].split(","))
                    and (("env" not in p) or e["env_id"] == p["env"])
                    and (("task" not in p) or p["task"] in e["task_id"])
                    and all(p.get(f, "any") == "any" or e[k] == (p[f] == "yes") for f, k in
                            (("truncated", "truncated"), ("infra", "infra_failure"),
                             ("traced", "traced"))))
        want = [e for e in entries if keep(e)]
        assert got["total"] == len(want)
        rows = got["episodes"]
        assert len(rows) == len(want[page * size:(page + 1) * size])
        assert {e["id"] for e in rows} <= {e["id"] for e in want}
        values = [e[sort] for e in rows if e[sort] is not None]
        assert values == sorted(values, reverse=order == "desc")
        missing = [e[sort] is None for e in rows]
        assert missing == sorted(missing)  # entries without a value come last
        if sort == "id":
            ids = [e["id"] for e in want]
            ids = ids[::-1] if order == "desc" else ids
            assert [e["id"] for e in rows] == ids[page * size:(page + 1) * size]
    assert query(entries, {})["facets"] == {"stop_reason": ["env_error", "max_turns",
                                                            "terminated"],
                                            "env": ["a/A-v0", "b/B-v0"]}


def test_the_unfiltered_list_reads_pages_without_the_whole_index(tmp_path):
    from sao_gym.rollout_store import RolloutReader, RolloutWriter, rollout_record
    from sao_gym.viewer.server import Viewer as App
    from tests.runtime.test_rollout_store import rollout

    with RolloutWriter(tmp_path, "train") as w:
        for i in range(57):
            w.write(rollout_record(rollout(task=f"t{i}", reward=float(i % 3 == 0),
                                           infra=i % 11 == 4), split="train", step=i // 4))
    app = App([tmp_path])
    for params in ({"size": "10", "page": "2"}, {"order": "desc", "size": "7", "page": "3"},
                   {"page": "99"}, {}, {"order": "desc"}, {"size": "500"}):
        fast = app._page(0, "train", params)
        slow = query(RolloutReader(tmp_path).episodes("train"), params)
        assert fast == slow, params
        if params == {"page": "99"}:  # only the rows shown were parsed
            assert sum(p is not None for p in app.readers[0]._splits["train"].parsed) == 16  # 20-35
    with pytest.raises(ValueError, match="size must be in"):
        app._page(0, "train", {"size": "0"})
