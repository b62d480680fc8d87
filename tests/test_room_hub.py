"""The room through the workshop hub, in browsers: one ``workshop serve`` with three accounts, each
logged in from a headless Chromium context of their own. The instructor opens their copy of
``11_the_room.ipynb``, sets it live (``REHEARSAL = False``, the room's name typed into the cell, as an
instructor would) and opens the room with its dashboard; two learners open ``the_room_learner.ipynb``,
type the room's name, one of them a wrong ring step, and run it: their kernels join. The instructor
runs §2's ring cell: the round runs on the learners' kernels, the wrong learner is named by their
Unix user in the instructor's verdict, and each learner reads the room's verdict in their own
notebook. The dashboard's figure is drawn with its traces; no cell raised; nothing of the workshop
listened beyond loopback; once the hub is stopped no process, /dev/shm or /tmp entry of the three
users, and no room folder, is left. The room played by kernels without a browser is
tests/test_room_kernels.py; the hub with Run All of chapter 0 is tests/test_workshop_hub.py.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from test_browser import (
    CHROMIUM,
    CHROMIUM_ARGS,
    FIGURE_CHECKS_JS,
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
    ROOT,
    exposed,
    kernel_idle,
    learners,
    log_in,
    type_into_cell,
    wait_until,
    workshop_hub,
)
from workshop_support import shared_install as shared_install  # a fixture

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.ch11]
INSTRUCTOR, RIGHT, WRONG = "lw-room-ina", "lw-room-ann", "lw-room-bob"
NAMES = [INSTRUCTOR, RIGHT, WRONG]
ROOM = "lw-room-hub"
ROOMS = Path("/tmp/lesson-rooms")  # lesson_lib.room.place.rooms_dir(): the hub passes no LESSON_ROOMS
LEARNER_NOTEBOOK = "the_room_learner.ipynb"
NOTEBOOKS = {INSTRUCTOR: "11_the_room.ipynb", RIGHT: LEARNER_NOTEBOOK, WRONG: LEARNER_NOTEBOOK}
LAB_OPEN_TIMEOUT_S = 120  # three JupyterLabs start at once on 2 cores
CELL_TIMEOUT_S = 120  # a cell that imports torch and plotly's widget, on a busy 2-core machine
ARTIFACTS = ROOT / "artifacts" / "workshop"
WRONG_STEP = f'''def my_step(rank, n, s):  # {WRONG}'s step: adds into the chunk it sends
    send_i = (rank - s) % n
    return send_i, send_i


if me is not None:
    me.submit("ring", my_step)'''

# The dashboard's FigureWidget as plotly.js drew it: its title, traces and points.
DASHBOARD_JS = """(panel) => {
  const gd = document.querySelector(panel + ' .jupyter-widgets .js-plotly-plot');
  if (!gd || !gd._fullData) return null;
  const points = gd._fullData.reduce((n, t) => n + ((t.x && t.x.length) || 0), 0);
  return {title: gd._fullLayout.title.text, traces: gd._fullData.length, points: points,
          arrows: (gd._fullLayout.annotations || []).filter(a => a.showarrow).length};
}"""


def _source(notebook: str, has: str) -> str:
    """The source of the installed notebook's code cell that holds ``has``."""
    cells = json.loads((ROOT / "notebooks" / notebook).read_text(encoding="utf-8"))["cells"]
    sources = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    return next(s for s in sources if has in s)


def _cell(page, has_text: str):
    return page.locator(f"{PANEL} .jp-CodeCell").filter(has_text=has_text).first


def _prompt(cell) -> str:
    return (cell.locator(".jp-InputPrompt").text_content() or "").strip()


def _run_cell(page, cell, what: str, timeout_s: float = CELL_TIMEOUT_S, while_waiting=None) -> str:
    """Run ``cell`` (Shift+Enter in its editor) and wait until its prompt shows a new count; its output."""
    before = _prompt(cell)
    cell.locator(".cm-content").click()
    page.keyboard.press("Shift+Enter")

    def ran():
        if while_waiting:
            while_waiting()
        p = _prompt(cell)
        return re.search(r"\[\d+\]", p) and p != before
    wait_until(what, ran, timeout_s, 0.2)
    return cell.locator(".jp-OutputArea").text_content() or ""


class Phases:
    """Each phase's time, printed as it ends."""

    def __init__(self):
        self.times: dict[str, float] = {}
        self.started = self.last = time.monotonic()

    def __call__(self, what: str) -> None:
        self.times[what] = time.monotonic() - self.last
        self.last = time.monotonic()
        print(f"{what}: {self.times[what]:.1f} s", flush=True)

    def __str__(self) -> str:
        return "; ".join(f"{w} {s:.1f} s" for w, s in self.times.items()) + \
            f"; in all {time.monotonic() - self.started:.1f} s"


def _open_labs(pages: dict, hub, phase: Phases) -> None:
    """Every account logs in (their servers start at once) and opens its notebook, its kernel idle."""
    for name, page in pages.items():
        log_in(page, hub.base, name, hub.password)
    for name, page in pages.items():
        page.wait_for_url(re.compile(f"/user/{name}/lab"), timeout=LAB_OPEN_TIMEOUT_S * 1000)
    for name, page in pages.items():
        page.goto(f"{hub.base}/user/{name}/lab/tree/{NOTEBOOKS[name]}", wait_until="domcontentloaded")
    for name, page in pages.items():
        page.locator(f"{PANEL} .jp-Notebook .jp-Cell").first.wait_for(
            state="visible", timeout=LAB_OPEN_TIMEOUT_S * 1000)
        wait_until(f"{name}'s kernel for {NOTEBOOKS[name]} to be idle",
                   lambda p=page, n=name: kernel_idle(p, n, NOTEBOOKS[n]), LAB_OPEN_TIMEOUT_S, 0.5)
    phase("three logins, JupyterLabs and kernels up")


def _open_room(ina, phase: Phases) -> None:
    """The instructor's notebook set live under the test's room name; the room opened, the dashboard shown."""
    settings = _source(NOTEBOOKS[INSTRUCTOR], "REHEARSAL = True")
    live = settings.replace("REHEARSAL = True", "REHEARSAL = False")
    live = live.replace('ROOM = "tuesday"', f'ROOM = "{ROOM}"')
    assert live.count(ROOM) == 1 and "REHEARSAL = False" in live, live
    type_into_cell(ina, PANEL, "REHEARSAL = True", live)
    _run_cell(ina, _cell(ina, "REHEARSAL = False"), "the instructor's settings cell (imports) to run")
    said = _run_cell(ina, _cell(ina, "rooms.open(ROOM"), "the instructor's room to open")
    assert said.strip() == "{}", f"the room's first learners(): {said!r}"
    _run_cell(ina, _cell(ina, "dash = Dashboard(room)"), "the dashboard cell to run")
    phase("the room opened, its dashboard shown")


def _join(pages: dict, look, phase: Phases) -> None:
    """Each learner types the room's name (bob a wrong step too) and runs their notebook: joined."""
    for name in (RIGHT, WRONG):
        page = pages[name]
        first = _source(NOTEBOOKS[name], 'ROOM = "tuesday"')
        type_into_cell(page, PANEL, 'ROOM = "tuesday"', first.replace("tuesday", ROOM))
        if name == WRONG:
            typed = type_into_cell(page, PANEL, "def my_step(rank, n, s):", WRONG_STEP)
            assert f"{WRONG}'s step" in typed.text_content(), "the wrong step did not reach the cell"
        _run_all(page)
    for name in (RIGHT, WRONG):
        try:  # a click the page was not ready for starts nothing: then once more
            pages[name].wait_for_function(STARTED_JS, arg=PANEL, timeout=30_000, polling=500)
        except Exception:
            print(f"{name}: Run All started no cell within 30 s: clicking it again")
            _run_all(pages[name])
    for name in (RIGHT, WRONG):
        wait_until(f"{name}'s Run All of {NOTEBOOKS[name]} to finish",
                   lambda p=pages[name]: look() or p.evaluate(RUN_FINISHED_JS, PANEL), CELL_TIMEOUT_S)
        said = _cell(pages[name], "me.log").locator(".jp-OutputArea").text_content()
        assert f"joined room '{ROOM}' as {name}" in said, f"{name}'s log: {said!r}"
    phase("two learners joined and submitted their steps")


def _ring(pages: dict, look, phase: Phases) -> None:
    """§2's ring cell on the instructor's page; each learner then reads the room's verdict (me.log)."""
    ina = pages[INSTRUCTOR]
    ring_cell = _cell(ina, 'rnd = room.run("ring")')
    verdict = _run_cell(ina, ring_cell, "the ring round to end", while_waiting=look)
    phase("the ring round, from the instructor's Shift+Enter to the verdict shown")
    assert "round 0 (ring): wrong hop" in verdict and WRONG in verdict, verdict
    assert RIGHT not in verdict, f"the right learner named in the verdict: {verdict}"
    logs = {}
    for name in (RIGHT, WRONG):
        def told(name=name):
            logs[name] = _run_cell(pages[name], _cell(pages[name], "me.log"), f"{name}'s log cell to run")
            return "round 0 (ring): wrong hop" in logs[name]
        wait_until(f"{name} to be told round 0's verdict in their notebook", told, 30, 0.5)
        assert "round 0 (ring): done" in logs[name], f"the round did not run on {name}'s kernel: {logs[name]}"
    assert f"{WRONG} ends without" in logs[WRONG] or f"came from {WRONG}" in logs[WRONG], logs[WRONG]
    phase("both learners told the verdict")


def _check_dashboard(ina) -> None:
    """The dashboard's figure drawn with round 0: its traces, the ring's arrows, the figure checks."""
    def drawn():
        d = ina.evaluate(DASHBOARD_JS, PANEL)
        return d if d and "round 0" in d["title"] else None
    board = wait_until("the dashboard to draw round 0", drawn, 30)
    assert "2 joined" in board["title"] and board["traces"] >= 2 and board["points"] >= 2, board
    assert board["arrows"] == 2, f"the ring's two arrows not drawn: {board}"
    bad = ina.evaluate(FIGURE_CHECKS_JS, PANEL)
    if bad:  # a FigureWidget being redrawn is briefly empty: keep what persists
        ina.wait_for_timeout(3000)
        bad = [b for b in ina.evaluate(FIGURE_CHECKS_JS, PANEL) if b in bad]
    assert not bad, "the dashboard hides data or text:\n" + "\n".join(bad)


def test_an_instructor_and_two_learners_play_the_ring_through_the_hub(shared_install):
    from playwright.sync_api import sync_playwright

    _require_browser()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    phase = Phases()
    with learners(NAMES) as users:
        uids = {u.pw_uid for u in users}
        homes = {u.pw_name: Path(u.pw_dir) for u in users}
        with workshop_hub(NAMES, ARTIFACTS / "room-hub.log") as hub:
            phase("hub up")
            seen: list[str] = []

            def look():
                seen.extend(exposed(hub.pids(uids)))

            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
                try:
                    pages = {n: browser.new_context(viewport=VIEWPORT).new_page() for n in NAMES}
                    for page in pages.values():
                        page.set_default_timeout(60_000)
                    _open_labs(pages, hub, phase)
                    _open_room(pages[INSTRUCTOR], phase)
                    _join(pages, look, phase)
                    _ring(pages, look, phase)
                    _check_dashboard(pages[INSTRUCTOR])
                    _cell(pages[INSTRUCTOR], "dash = Dashboard(room)").scroll_into_view_if_needed()
                    pages[INSTRUCTOR].screenshot(path=str(ARTIFACTS / "room-instructor.png"))
                    pages[WRONG].screenshot(path=str(ARTIFACTS / "room-wrong-learner.png"))
                    saved = {n: _save_and_read(p, homes[n] / "course" / NOTEBOOKS[n])
                             for n, p in pages.items()}
                    phase("dashboard checked, notebooks saved")
                finally:
                    browser.close()
            for name, nb in saved.items():
                errors = _error_outputs(nb)
                assert not errors, f"{name}'s cells raised:\n" + "\n---\n".join(errors)
            assert (ROOMS / ROOM).is_dir(), "the room's folder is not where the learners joined it"
            assert not seen, "the workshop listened beyond loopback:\n" + "\n".join(sorted(set(seen)))

            # Stopped as Ctrl-C would: nothing of the three users, and no room, is left.
            hub.stop_and_check(users)
            phase("the hub stopped and cleaned up")
            assert not (ROOMS / ROOM).exists(), f"the room's folder {ROOMS / ROOM} was left"
    print(f"phases: {phase}")
