"""Each chapter is also its own slideshow (lesson_lib/slides.py, jupyterlab-rise): the slide types
follow the headings, every chapter carries them, and chapter 2 steps through every slide in a real
browser."""

import json
import os
import secrets
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from test_browser import _free_port  # one JupyterLab port helper for the browser tests
from workshop_support import shared_install as shared_install  # a fixture

from lesson_lib import slides

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def _md(text):
    return {"cell_type": "markdown", "source": text, "metadata": {}}


def _code(text):
    return {"cell_type": "code", "source": text, "metadata": {}, "outputs": [], "execution_count": None}


def test_slide_types_follow_the_headings():
    cells = [_md("# Chapter 9"), _md("more intro"), _code("x = 1"), _md("## 1. A section"), _code("f()"),
             _md("what the figure shows"), _md("### a subsection"), _md("<details><summary>why"), _code(""),
             _code("g()")]
    nb = slides.mark({"cells": cells, "metadata": {}})
    kinds = [c["metadata"].get("slideshow", {}).get("slide_type", "-") for c in nb["cells"]]
    assert kinds == ["slide", "-", "-", "slide", "-", "subslide", "subslide", "notes", "skip", "-"]
    assert slides.slides(nb) == 4
    assert nb["metadata"]["rise"]["scroll"] is True  # a tall slide scrolls instead of being cut


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name[:2])
def test_every_chapter_carries_its_slides(path):
    nb = json.loads(path.read_text())
    fresh = slides.mark(json.loads(path.read_text()))
    assert nb == fresh, f"{path.name}: run `python -m lesson_lib slides` then `make sync-notebooks`"
    assert slides.slides(nb) >= 8, path.name  # a chapter is more than a handful of slides


@pytest.mark.slow
@pytest.mark.browser
def test_chapter_2_steps_through_every_slide(tmp_path, shared_install):
    """jupyterlab-rise's standalone presenter (``/rise/<notebook>``) in headless Chromium: Space
    advances, through every slide and sub-slide, to the last. The presenter comes with the workshop
    extra, so the JupyterLab is the workshop's shared install (tests/workshop_support.py)."""
    from playwright.sync_api import sync_playwright

    venv, _ = shared_install
    if not Path("/usr/bin/chromium").is_file():
        if os.environ.get("CI"):
            pytest.fail("/usr/bin/chromium is missing")
        pytest.skip("/usr/bin/chromium is missing")
    name = "02_ring_allreduce.ipynb"
    (tmp_path / name).write_bytes((ROOT / "notebooks" / name).read_bytes())
    expected = slides.slides(json.loads((tmp_path / name).read_text()))
    token, port = secrets.token_hex(16), _free_port()
    env = {**os.environ, **{k: str(tmp_path / k.lower()) for k in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR",
                                                                   "JUPYTER_RUNTIME_DIR")}}
    server = subprocess.Popen([str(venv / "bin" / "python"), "-m", "jupyter", "lab", "--ip=127.0.0.1",
                               f"--port={port}", "--no-browser", "--allow-root",
                               f"--IdentityProvider.token={token}", f"--notebook-dir={tmp_path}"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_for(url + f"/api/status?token={token}", 90, "the JupyterLab server to answer")
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium",
                                        args=["--headless", "--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1280, "height": 720})
            page.goto(f"{url}/rise/{name}?token={token}")
            page.wait_for_selector(".reveal .slides > section.present", timeout=120_000)
            seen, last = [], None
            for _ in range(expected + 5):  # a few presses past the end: nothing moves any more
                where = page.evaluate(POSITION_JS)
                if where != last:
                    seen.append(tuple(where))
                last = where
                page.keyboard.press("Space")
                page.wait_for_timeout(250)
            shots = ROOT / "artifacts" / "slides"
            shots.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(shots / "02_last_slide.png"))
            browser.close()
        assert len(seen) == len(set(seen)) == expected, (expected, seen)
        assert seen[0] == (0, 0)
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)


# (horizontal slide, vertical sub-slide) of the slide on screen
POSITION_JS = """() => {
  const h = [...document.querySelectorAll('.reveal .slides > section')];
  const i = h.findIndex(s => s.classList.contains('present'));
  const v = i >= 0 ? [...h[i].querySelectorAll(':scope > section')] : [];
  return [i, Math.max(0, v.findIndex(s => s.classList.contains('present')))];
}"""


def _wait_for(url: str, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=5).close()
            return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"waited {timeout_s} s for {what} ({url})")
