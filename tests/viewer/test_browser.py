"""``sao-gym view`` in headless Chromium: a 20-step run's curves, list, filters, episode page,
token strip and hover values; a hostile run's strings shown as text, with no script run."""

import json
import math

import pytest

from sao_gym.cli import main
from sao_gym.rollout_store import RolloutReader
from tests.viewer.helpers import (
    HOSTILE,
    TINY_RUN,
    Viewer,
    chromium,
    console_errors,
    hostile_run,
)

pytestmark = pytest.mark.slow

TRAIN = [*TINY_RUN, "--set", "total_steps=20", "--set", "rollout.batch_size=2",
         "--set", "rollout.concurrency=4", "--set", "inference.max_batch_size=4",
         "--set", "eval.episodes=3", "--set", "checkpoint.every=0",
         "--set", "logging.rollouts_per_step=2"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A 20-step `sao-gym train` run, and a run of hostile rollouts."""
    base = tmp_path_factory.mktemp("view")
    trained = base / "trained"
    assert main(["train", *TRAIN, "--out", str(trained)]) == 0
    return trained, hostile_run(base / "hostile")


@pytest.fixture(scope="module")
def viewer(runs):
    with Viewer(*runs) as v:
        yield v


@pytest.fixture(scope="module")
def browser():
    driver = chromium()
    yield driver
    driver.quit()


def _wait(driver, test, timeout=15):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.1,
                         ignored_exceptions=(StaleElementReferenceException,)).until(
        lambda d: test(d))


def _drawn(driver):
    """Whether the app has drawn the page of the current URL (``main[data-ready]``)."""
    return driver.execute_script(
        "return document.getElementById('main').dataset.ready === location.hash")


def _css(driver, selector):
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, selector)


def _open(driver, url, ready):
    driver.get("about:blank")  # a fresh page load, whatever page was open
    driver.get(url)
    return _wait(driver, lambda d: _drawn(d) and _css(d, ready))


def _count(driver):
    return int(_css(driver, "#count")[0].text.split()[0])


def _safe(driver):
    assert driver.execute_script("return window.__pwned === undefined")
    assert driver.execute_script("return document.scripts.length") == 2  # ours only
    assert console_errors(driver) == []


def test_the_overview_shows_the_runs_and_their_curves(browser, viewer, runs):
    _open(browser, viewer.url + "/", ".chart canvas")
    rows = [r.text for r in _css(browser, "#runs tbody tr")]
    assert rows[0].startswith("trained") and " 20 " in rows[0]
    assert "train" in rows[0] and "eval_after" in rows[0] and "eval_before" in rows[0]
    titles = [t.text for t in _css(browser, ".chart .title span")]
    assert titles[:2] == ["rollout/success_rate", "rollout/return_mean"]
    picker = [o.text for o in _css(browser, "#add-metric option")]
    assert HOSTILE[1] in picker  # a metric named like markup is an option's text
    _safe(browser)


def test_curves_follow_a_run_that_is_training(browser, tmp_path):
    run = hostile_run(tmp_path / "live", episodes=1)
    with Viewer(run) as v:
        _open(browser, v.url + "/", ".chart canvas")
        assert _css(browser, "td.steps")[0].text == "3"
        with open(run / "metrics.jsonl", "a") as f:  # two more steps land
            for s in (4, 5):
                f.write(json.dumps({"step": s, "rollout/success_rate": 0.5}) + "\n")
        _wait(browser, lambda d: _css(d, "td.steps")[0].text == "5", timeout=12)
        _safe(browser)


def test_filters_and_sorting_change_the_episode_list(browser, viewer, runs):
    from selenium.webdriver.support.ui import Select

    entries = RolloutReader(runs[0]).episodes("train")
    assert len([e for e in entries if e["traced"]]) == 40  # 2 a step, 20 steps
    _open(browser, viewer.url + "/#/runs/0/train", "#episodes tr")
    assert _count(browser) == len(entries)
    assert len(_css(browser, "#episodes tr")) == min(50, len(entries))
    reasons = sorted({e["stop_reason"] for e in entries})
    Select(_css(browser, "select[name=stop_reason]")[0]).select_by_value(reasons[-1])
    want = sum(e["stop_reason"] == reasons[-1] for e in entries)
    _wait(browser, lambda d: "stop_reason=" in d.current_url and _drawn(d) and _count(d) == want)
    # a numeric filter typed in, then a sort by reward, descending
    _open(browser, viewer.url + "/#/runs/0/train?size=10", "#filters input[name=step_min]")
    box = _css(browser, "#filters input[name=step_min]")[0]
    box.send_keys("15")
    box.submit()
    _wait(browser, lambda d: "step_min=15" in d.current_url and _drawn(d)
          and _count(d) == sum(e["step"] >= 15 for e in entries))
    for order in ("asc", "desc"):
        _css(browser, "th[data-key=reward]")[0].click()
        _wait(browser, lambda d, o=order: f"order={o}" in d.current_url and _drawn(d)
              and _css(d, f"th.sorted-{o}"))
    rewards = [float(r.find_elements("css selector", "td")[2].text)
               for r in _css(browser, "#episodes tr")]
    assert rewards == sorted(rewards, reverse=True) and len(rewards) == min(10, _count(browser))
    if _count(browser) > 10:
        first = _css(browser, "#episodes tr")[0].text
        _css(browser, "#next")[0].click()
        _wait(browser, lambda d: "page=1" in d.current_url and _drawn(d)
              and _css(d, "#episodes tr")[0].text != first)
    _safe(browser)


def _tip_values(text):
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(": ")
        try:
            out[key] = float(value)
        except ValueError:
            continue
    return out


def test_an_episode_page_shows_the_conversation_and_every_token_with_its_values(
        browser, viewer, runs):
    from selenium.webdriver import ActionChains
    from selenium.webdriver.support.ui import Select

    reader = RolloutReader(runs[0])
    entry = next(e for e in reader.episodes("train") if e["traced"] and e["step"] == 20)
    record = reader.record("train", entry["id"])
    _open(browser, viewer.url + f"/#/runs/0/train/{entry['id']}", "#strip span")
    spans = _css(browser, "#strip span")
    assert len(spans) == len(record["tokens"]["id"])
    assert "".join(s.get_attribute("textContent") for s in spans).replace(
        "↵\n", "\n") == "".join(record["tokens"]["text"])
    roles = [r.text.lower() for r in _css(browser, "#conversation .role")]
    assert roles == [m["role"] for m in record["messages"]]
    masked = sum(1 for m, k in zip(record["tokens"]["mask"], record["learner"]["dis_mask"],
                                   strict=True) if m and not k)
    assert len(_css(browser, "#strip span.masked")) == masked
    options = [o.get_attribute("value") for o in _css(browser, "#colour option")]
    assert {"advantage", "value", "return", "ratio", "dis_mask", "logprob",
            "sampler_logprob", "policy_version"} == set(options)
    action = [i for i, m in enumerate(record["tokens"]["mask"]) if m]
    for i in (action[0], action[-1]):
        ActionChains(browser).move_to_element(spans[i]).perform()
        _wait(browser, lambda d, i=i: f"token {i}:" in _css(d, "#tip")[0].text)
        shown = _tip_values(_css(browser, "#tip")[0].text)
        for key, label in (("advantage", "advantage"), ("value", "value"),
                           ("ratio", "importance ratio"), ("logprob", "learner logprob")):
            assert math.isclose(shown[label], record["learner"][key][i], abs_tol=2e-6), key
        assert shown["sampler logprob"] == pytest.approx(
            record["tokens"]["sampler_logprob"][i], abs=2e-6)
    versions = [v for v, m in zip(record["tokens"]["policy_version"], record["tokens"]["mask"],
                                  strict=True) if m]
    Select(_css(browser, "#colour")[0]).select_by_value("policy_version")
    assert _css(browser, ".legend")[0].text == (
        f"{min(versions)} … {max(versions)} on action tokens")
    assert spans[action[0]].value_of_css_property("background-color") != "rgba(0, 0, 0, 0)"
    _safe(browser)


def test_evaluation_episodes_of_a_checkpoint_have_their_pages(browser, viewer, runs):
    entries = RolloutReader(runs[0]).episodes("eval_after")
    assert len(entries) == 3 and {e["step"] for e in entries} == {20}
    _open(browser, viewer.url + "/#/runs/0/eval_after", "#episodes tr")
    assert _count(browser) == 3
    _css(browser, "#episodes tr a")[0].click()
    _wait(browser, lambda d: "eval_after/" in d.current_url and _drawn(d)
          and _css(d, "#strip span"))
    options = [o.get_attribute("value") for o in _css(browser, "#colour option")]
    assert options == ["sampler_logprob", "policy_version"]  # no learner values for these
    _safe(browser)


def test_hostile_strings_are_text_and_run_nothing(browser, viewer, runs):
    from selenium.webdriver import ActionChains

    _open(browser, viewer.url + "/#/runs/1/train", "#episodes tr")
    tasks = [r.find_elements("css selector", "td")[5].text for r in _css(browser, "#episodes tr")]
    assert any(HOSTILE[1] in t for t in tasks)  # the markup, as text
    _safe(browser)
    _open(browser, viewer.url + "/#/runs/1/train/0", "#strip span")
    conversation = _css(browser, "#conversation")[0]
    text = conversation.get_attribute("textContent")
    for bad in HOSTILE:
        assert bad in text
    assert len(text) > 1 << 20  # the 1 MB line, whole
    assert browser.execute_script(
        "return document.querySelectorAll('#main img, #main script, #main iframe, "
        "#main a[href^=javascript], #main [onerror]').length") == 0
    spans = _css(browser, "#strip span")
    ActionChains(browser).move_to_element(spans[1]).perform()
    _wait(browser, lambda d: HOSTILE[0] in _css(d, "#tip")[0].text)
    for link in _css(browser, "#main a"):  # every link is one of the app's own routes
        assert link.get_attribute("href").startswith(viewer.url + "/#/")
    _safe(browser)


def test_the_segments_of_a_gateway_episode_are_marked_in_the_token_strip(browser, viewer, runs):
    _open(browser, viewer.url + "/#/runs/1/train/1", "#strip span")
    breaks = _css(browser, "#strip .segment-break")
    assert len(breaks) == 1 and breaks[0].text.startswith("segment 2:")
    # the marker sits right before token 6, where the second segment starts
    assert browser.execute_script(
        "return document.querySelector('#strip .segment-break').nextElementSibling"
        ".dataset.i") == "6"
    assert len(_css(browser, "#strip span")) == 8
    _open(browser, viewer.url + "/#/runs/1/train/0", "#strip span")
    assert _css(browser, "#strip .segment-break") == []
    _safe(browser)
