"""The workshop server for real: ``python -m lesson_lib workshop serve`` with three learners, each in a
headless Chromium of their own at once. Each logs in, lands on the table of contents, writes an answer
to chapter 0's first exercise, runs the chapter with Run All and gets the exercise's verdict; each
learner's saved notebook holds their answer and no one else's. While it runs, nothing of the workshop
listens beyond loopback; once the hub is stopped, no process, temp folder or shared-memory segment of
the workshop is left. The browser helpers are tests/test_browser.py's.
"""

from __future__ import annotations

import json
import pwd
import re
import subprocess
import time
from pathlib import Path

import pytest
from conftest import cli_in_process
from test_browser import (
    CHROMIUM,
    CHROMIUM_ARGS,
    PANEL,
    RUN_FINISHED_JS,
    STARTED_JS,
    VIEWPORT,
    _error_outputs,
    _require_browser,
    _run_all,
    _save_and_read,
)
from workshop_support import (
    PREFIX,
    ROOT,
    exposed,
    kernel_idle,
    learners,
    log_in,
    process_name,
    type_into_cell,
    wait_until,
    workshop_hub,
)
from workshop_support import shared_install as shared_install  # a fixture

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.ch0]
NAMES = ["lw-hub-ana", "lw-hub-ben", "lw-hub-cy"]
NOTEBOOK = "00_why_distributed.ipynb"
LAB_OPEN_TIMEOUT_S = 120  # three JupyterLabs start at once on 2 cores
RUN_ALL_TIMEOUT_S = 600  # three chapter-0 Run Alls at once on 2 cores
ARTIFACTS = ROOT / "artifacts" / "workshop"
TOC_HEADING = (ROOT / "notebooks" / "README.md").read_text(encoding="utf-8").splitlines()[0].lstrip("# ")
ANSWER = """def average_gradients(model):  # the answer of {name}
    world = dist.get_world_size()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world


exercises["average_gradients"].submit(average_gradients)"""


def _marker(name: str) -> str:
    return f"# the answer of {name}"


def _workshop_cli(*args: str) -> subprocess.CompletedProcess:
    """``python -m lesson_lib workshop ARGS --prefix PREFIX``, its main run in this process."""
    return cli_in_process("workshop", *args, "--prefix", str(PREFIX))


def _write_answer(page, name: str) -> None:
    """Replace the exercise's template cell with this learner's answer, typed into its editor."""
    cell = type_into_cell(page, PANEL, "def average_gradients(model):", ANSWER.format(name=name))
    assert _marker(name) in cell.text_content(), f"{name}'s answer did not reach the cell"


def _verdict(notebook: dict) -> str:
    """The printed verdict of the exercise's submit cell."""
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code" and "def average_gradients" in "".join(cell["source"]):
            return "".join("".join(o.get("text", "")) for o in cell.get("outputs", []))
    return ""


def test_three_learners_run_chapter_0_on_one_hub(shared_install):
    from playwright.sync_api import sync_playwright

    _require_browser()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with learners(NAMES) as users:
        uids = {u.pw_uid for u in users}
        started = time.monotonic()
        with workshop_hub(NAMES, ARTIFACTS / "hub.log") as hub:
            serve, base, password, state = hub.serve, hub.base, hub.password, hub.state
            hub_s = time.monotonic() - started
            exposed_seen: list[str] = []
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
                try:
                    pages = {n: browser.new_context(viewport=VIEWPORT).new_page() for n in NAMES}
                    for page in pages.values():
                        page.set_default_timeout(60_000)
                    for name, page in pages.items():  # the three servers start at once
                        log_in(page, base, name, password)
                    opened = time.monotonic()
                    for name, page in pages.items():  # each lands on the table of contents, rendered
                        page.wait_for_url(re.compile(f"/user/{name}/lab"), timeout=LAB_OPEN_TIMEOUT_S * 1000)
                        page.locator(".jp-MarkdownViewer .jp-RenderedMarkdown h1", has_text=TOC_HEADING)\
                            .first.wait_for(state="visible", timeout=LAB_OPEN_TIMEOUT_S * 1000)
                    lab_s = time.monotonic() - opened
                    print(f"hub up in {hub_s:.1f} s; three JupyterLabs on the contents in {lab_s:.1f} s")
                    for name, page in pages.items():
                        page.goto(f"{base}/user/{name}/lab/tree/{NOTEBOOK}", wait_until="domcontentloaded")
                    for name, page in pages.items():
                        page.locator(f"{PANEL} .jp-Notebook .jp-Cell").first.wait_for(
                            state="visible", timeout=LAB_OPEN_TIMEOUT_S * 1000)
                        wait_until(f"{name}'s kernel to be idle",
                                   lambda p=page, n=name: kernel_idle(p, n, NOTEBOOK),
                                   LAB_OPEN_TIMEOUT_S, 0.5)
                        _write_answer(page, name)
                    run_started = {}
                    for name, page in pages.items():
                        _run_all(page)
                        run_started[name] = time.monotonic()
                    for name, page in pages.items():
                        try:  # a click the page was not ready for starts nothing: then once more
                            page.wait_for_function(STARTED_JS, arg=PANEL, timeout=30_000, polling=500)
                        except Exception:
                            print(f"{name}: Run All started no cell within 30 s: clicking it again")
                            _run_all(page)
                    run_all_s, deadline = {}, time.monotonic() + RUN_ALL_TIMEOUT_S
                    while len(run_all_s) < len(NAMES):
                        exposed_seen += exposed(hub.pids(uids))
                        for name, page in pages.items():
                            if name not in run_all_s and page.evaluate(RUN_FINISHED_JS, PANEL):
                                run_all_s[name] = time.monotonic() - run_started[name]
                        assert time.monotonic() < deadline, \
                            f"Run All of {NOTEBOOK} for {sorted(set(NAMES) - set(run_all_s))} did not " \
                            f"finish within {RUN_ALL_TIMEOUT_S} s"
                        time.sleep(1)
                    saved = {}
                    for name, page in pages.items():
                        saved[name] = _save_and_read(page, Path(f"/home/{name}/course/{NOTEBOOK}"))
                        page.screenshot(path=str(ARTIFACTS / f"{name}.png"))
                finally:
                    browser.close()
            for name, nb in saved.items():
                errors = _error_outputs(nb)
                assert not errors, f"{name}'s cells raised:\n" + "\n---\n".join(errors)
                assert "✓ correct" in _verdict(nb), f"{name}'s verdict: {_verdict(nb)!r}"
                text = json.dumps(nb)
                others = [o for o in NAMES if o != name and _marker(o) in text]
                assert _marker(name) in text and not others, f"{name}'s notebook holds answers of {others}"
            assert not exposed_seen, \
                "the workshop listened beyond loopback:\n" + "\n".join(sorted(set(exposed_seen)))
            print("Run All of chapter 0, three learners at once: "
                  + ", ".join(f"{n} {s:.1f} s" for n, s in run_all_s.items()))

            # Stopped as Ctrl-C would: nothing of the workshop is left.
            tree = hub.pids(uids) - {serve.pid}
            culler = [process_name(p) for p in tree if "jupyterhub_idle_culler" in process_name(p)]
            assert culler, "the idle culler is not running"
            ana = NAMES[0]
            busy = _workshop_cli("reset", ana)  # refused while her server runs: it would save over the copy
            assert busy.returncode == 2 and "--stop" in busy.stderr, busy.stderr
            print(f"the workshop stopped and cleaned up in {hub.stop_and_check(users):.1f} s")
            for u in users:
                tmp = Path(u.pw_dir, ".cache", "lesson-workshop", "tmp")
                assert not list(tmp.iterdir()), f"{u.pw_name}'s temp folder kept {list(tmp.iterdir())}"
            assert not list(state.glob("*.pid")), list(state.glob("*.pid"))
            written = [str(p) for p in (PREFIX / "course").rglob("*") if p.stat().st_uid in uids]
            assert not written, f"learners wrote into the install: {written[:5]}"
            reset = _workshop_cli("reset", ana)  # a clean copy; hers is kept aside with her answer
            assert reset.returncode == 0, reset.stderr
            home = Path(pwd.getpwnam(ana).pw_dir)
            old = list(home.glob("course-before-reset-*"))
            assert len(old) == 1 and _marker(ana) in (old[0] / NOTEBOOK).read_text(encoding="utf-8")
            installed = PREFIX / "course" / "notebooks" / NOTEBOOK
            assert (home / "course" / NOTEBOOK).read_bytes() == installed.read_bytes()
