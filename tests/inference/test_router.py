"""Router: least outstanding work, round-robin ties, sticky sessions, dead servers."""

import pytest

from sao_gym.inference.base import InferenceError
from sao_gym.inference.router import NoServersAvailable, Router

URLS = ["http://a:1", "http://b:2", "http://c:3"]


def urls(servers):
    return [s.url for s in servers]


def test_cost_weighs_prompt_tokens_by_prefill_cost():
    assert Router(URLS).cost(160, 10) == 20.0
    assert Router(URLS, prefill_cost=4.0).cost(8, 3) == 5.0


def test_least_outstanding_work_picks_the_least_loaded_server():
    r = Router(URLS)
    a, b, c = r.servers
    a.outstanding, b.outstanding, c.outstanding = 50.0, 5.0, 20.0
    got = r.acquire(7.0)
    assert got is b
    assert b.outstanding == 12.0 and b.in_flight == 1
    # b (12) is still the least loaded
    assert r.acquire(1.0) is b
    # now b = 13, c = 20: raising b above c moves the next request to c
    assert r.acquire(10.0) is b  # 13 < 20
    assert r.acquire(1.0) is c  # b = 23 > c = 20
    assert [s.in_flight for s in r.servers] == [0, 3, 1]


def test_ties_rotate_round_robin():
    r = Router(URLS)
    picked = [r.acquire(0.0).url for _ in range(6)]
    assert picked == URLS * 2
    assert all(s.in_flight == 2 for s in r.servers)


def test_equal_costs_spread_evenly_and_release_frees_the_work():
    r = Router(URLS)
    held = [(r.acquire(5.0), 5.0) for _ in range(3)]
    assert sorted(urls(s for s, _ in held)) == sorted(URLS)
    assert [s.outstanding for s in r.servers] == [5.0, 5.0, 5.0]
    first, cost = held[0]
    r.release(first, cost)
    assert first.outstanding == 0.0 and first.in_flight == 0 and first.served == 1
    assert r.acquire(1.0) is first  # now the least loaded
    other, cost = held[1]
    r.release(other, cost, ok=False)
    assert other.outstanding == 0.0 and other.in_flight == 0 and other.served == 0


def test_release_never_makes_outstanding_negative():
    r = Router(URLS[:1])
    s = r.acquire(1.0)
    r.release(s, 3.0)
    assert s.outstanding == 0.0


def test_a_session_sticks_to_its_server_even_when_another_is_less_loaded():
    r = Router(URLS)
    home = r.acquire(100.0, session="ep1")
    for _ in range(5):
        assert r.acquire(100.0, session="ep1") is home
    assert home.outstanding == 600.0 and home.in_flight == 6
    # a request without a session avoids the loaded server
    assert r.acquire(1.0) is not home
    # a new session goes to the least loaded one
    assert r.acquire(1.0, session="ep2") is not home


def test_a_session_moves_when_its_server_is_marked_dead_and_then_sticks_there():
    r = Router(URLS)
    home = r.acquire(1.0, session="ep")
    r.release(home, 1.0)
    assert r.mark_dead(home, "gone")
    assert "ep" not in r._sessions  # its sessions are forgotten with it
    moved = r.acquire(1.0, session="ep")
    assert moved is not home and moved.alive
    # the other live server gets lighter, but the session stays on its new home
    other = next(s for s in r.alive if s is not moved)
    other.outstanding = 0.0
    moved.outstanding = 1000.0
    assert r.acquire(1.0, session="ep") is moved
    assert home.in_flight == 0


def test_the_session_table_is_bounded_oldest_forgotten_first():
    r = Router(URLS, max_sessions=2)
    s1 = r.acquire(0.0, session="s1")
    s2 = r.acquire(0.0, session="s2")
    assert s2 is not s1
    r.acquire(0.0, session="s1")  # s1 becomes the newest again
    r.acquire(0.0, session="s3")  # forgets s2, the oldest
    assert list(r._sessions) == ["s1", "s3"]
    # s1 is still sticky even where it is the most loaded
    s1.outstanding = 1e9
    assert r.acquire(0.0, session="s1") is s1
    # s2 was forgotten: with its old server loaded it goes elsewhere (a known
    # session would have stuck, like s1)
    s2.outstanding = 1e9
    assert r.acquire(0.0, session="s2") not in (s1, s2)
    assert list(r._sessions) == ["s1", "s2"]


def test_mark_dead_returns_true_once_and_the_server_is_never_chosen_again():
    r = Router(URLS)
    a = r.servers[0]
    assert r.mark_dead(a, "connection refused") is True
    assert r.mark_dead(a, "again") is False
    assert a.dead_reason == "connection refused" and not a.alive
    assert urls(r.alive) == URLS[1:]
    a.outstanding = -1.0  # even the "least loaded", it is never picked
    assert all(r.acquire(0.0) is not a for _ in range(10))


def test_all_dead_raises_naming_every_url_and_reason():
    r = Router(URLS)
    for s, why in zip(r.servers, ["refused", "HTTP 500", "timeout"], strict=True):
        assert r.mark_dead(s, why)
    with pytest.raises(NoServersAvailable) as err:
        r.acquire(1.0, session="x")
    msg = str(err.value)
    for url, why in zip(URLS, ["refused", "HTTP 500", "timeout"], strict=True):
        assert f"{url}: {why}" in msg
    assert isinstance(err.value, InferenceError)
    assert msg == r.down_message()
    assert all(s.in_flight == 0 for s in r.servers)


@pytest.mark.parametrize("bad", [[], ["http://a:1", "http://b:2", "http://a:1"]])
def test_empty_or_duplicate_urls_raise(bad):
    with pytest.raises(ValueError, match="at least one|distinct"):
        Router(bad)
