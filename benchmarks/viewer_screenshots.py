"""The screenshots of docs/metrics.md: `sao-gym view` on a run, in headless Chromium.

    .venv/bin/python benchmarks/viewer_screenshots.py RUN_DIR --out docs/img

writes ``viewer_runs.png`` (runs and curves), ``viewer_list.png`` (the ``train``
split's episodes, best reward first) and ``viewer_episode.png`` (a traced,
solved training episode of the last steps, coloured by advantage, one action
token hovered).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sao_gym.rollout_store import RolloutReader  # noqa: E402


def _drawn(driver, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not driver.execute_script(
            "return document.getElementById('main').dataset.ready === location.hash"):
        if time.monotonic() > deadline:
            raise TimeoutError("the page was not drawn")
        time.sleep(0.05)


def main(argv: list[str] | None = None) -> None:
    from selenium.webdriver import ActionChains
    from selenium.webdriver.common.by import By

    from tests.viewer.helpers import Viewer, chromium

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir")
    p.add_argument("--out", default="docs/img")
    p.add_argument("--episode", type=int, help="the episode to show (default: see above)")
    args = p.parse_args(argv)
    run, out = Path(args.run_dir), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    entries = RolloutReader(run).episodes("train")
    episode = args.episode
    if episode is None:
        solved = [e for e in entries if e["traced"] and (e["reward"] or 0) >= 1]
        episode = (solved or entries)[-1]["id"]
    driver = chromium()
    try:
        with Viewer(run) as v:
            for name, route in (("viewer_runs", "#/"),
                                ("viewer_list", "#/runs/0/train?sort=step&order=desc"),
                                ("viewer_episode", f"#/runs/0/train/{episode}")):
                driver.get("about:blank")
                driver.get(f"{v.url}/{route}")
                _drawn(driver)
                time.sleep(0.5)  # the curves' canvas
                if name == "viewer_episode":
                    driver.set_window_size(1400, 1500)
                    time.sleep(0.3)
                    strip = driver.find_element(By.ID, "strip")
                    driver.execute_script("arguments[0].scrollIntoView()", strip)
                    acts = driver.find_elements(By.CSS_SELECTOR, "#strip span.act")
                    ActionChains(driver).move_to_element(acts[len(acts) // 2]).perform()
                    time.sleep(0.3)
                path = out / f"{name}.png"
                driver.save_screenshot(str(path))
                print(path)
    finally:
        driver.quit()


if __name__ == "__main__":
    main()
