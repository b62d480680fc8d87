"""Drive a real JupyterLab in headless Chromium the way a learner would, chapter by chapter:
open the notebook, Run -> Run All Cells, and check that it ran without errors, that every plotly
figure drew and every widget rendered, that no figure's text is cut off at its edge or covered by its
legend (tests/figure_checks.js, on the rendered boxes), that the browser logged no error, that an
animation steps when played, and that one control of the chapter changes its output when used.

This is where `make test` runs each notebook with the machine's own kernels (nbval runs chapters 4
and 6 again under ATen's portable kernels, `make test-numerics`).

The notebooks folder is copied into tmp_path and served from there, so nothing the
browser does (autosave, checkpoints) touches the clean notebooks in the repository.
Screenshots and logs go to artifacts/browser/ whether the test passes or fails; a chapter that
passes has its Run All time merged into artifacts/browser/run_all_times.json, which
`python benchmarks/run_all_table.py` renders as benchmarks/run-all.md.

Point it at one notebook with BROWSER_TEST_NOTEBOOK: a name inside notebooks/,
or a path to an .ipynb elsewhere, which is copied into the served folder.
"""

from __future__ import annotations

import json
import os
import platform
import re
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS_DIR = ROOT / "notebooks"
ARTIFACTS = ROOT / "artifacts" / "browser"
RUN_ALL_TIMES = ARTIFACTS / "run_all_times.json"  # each chapter's last passing run: benchmarks/run-all.md
CHAPTERS = sorted(p.name for p in NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb"))
NOTEBOOKS = [os.environ["BROWSER_TEST_NOTEBOOK"]] if os.environ.get("BROWSER_TEST_NOTEBOOK") else CHAPTERS
CHROMIUM = "/usr/bin/chromium"
FIGURE_CHECKS_JS = (Path(__file__).parent / "figure_checks.js").read_text()
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
SERVER_START_TIMEOUT_S = 60
NOTEBOOK_LOAD_TIMEOUT_S = 90
RUN_ALL_TIMEOUT_S = 450  # about twice the slowest chapter's (5) Run All on a slow 2-core machine
CONTROL_TIMEOUT_S = 120  # an explorer's run starts real ranks
VIEWPORT = {"width": 1400, "height": 1000}
MAX_SCREENSHOT_HEIGHT = 12000

# The active notebook panel (other panels, e.g. the launcher, are hidden).
PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden)"

# JavaScript for the page: true once Run All has finished, i.e. no cell is queued or
# running ([*]), the kernel is idle, and either every non-empty code cell has an
# execution count or an error output stopped the run.
RUN_FINISHED_JS = """
(panel) => {
  const root = document.querySelector(panel);
  if (!root) return false;
  const status = root.querySelector('.jp-Notebook-ExecutionIndicator');
  if (!status || status.getAttribute('data-status') !== 'idle') return false;
  const cells = [...root.querySelectorAll('.jp-Notebook .jp-CodeCell')];
  const prompts = cells
    .filter(c => (c.querySelector('.cm-content')?.textContent ?? '').trim() !== '')
    .map(c => (c.querySelector('.jp-InputPrompt')?.textContent ?? '').trim());
  if (prompts.some(p => p.includes('*'))) return false;
  const allRan = prompts.length > 0 && prompts.every(p => /\\[\\d+\\]/.test(p));
  // An error stops Run All: the rest of the cells go back to [ ].
  const errored = [...root.querySelectorAll(
      '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')]
    .some(e => /Traceback|Error/.test(e.textContent));
  return allRan || errored;
}
"""

ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

PROMPTS_JS = """
(panel) => [...document.querySelectorAll(panel + ' .jp-Notebook .jp-CodeCell .jp-InputPrompt')]
  .map(e => e.textContent.trim())
"""


def _missing(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (required when CI is set)")
    pytest.skip(reason)


def _require_browser() -> None:
    if not Path(CHROMIUM).is_file():
        _missing(f"{CHROMIUM} is missing (apt-get install chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        _missing("playwright is not installed (make install)")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _notebook_to_serve(served: Path, notebook: str) -> str:
    """Copy the notebook named ``notebook`` into the served folder if needed; return its name."""
    candidate = Path(notebook)
    if candidate.name != notebook or candidate.is_absolute():
        if not candidate.is_file():
            pytest.fail(f"BROWSER_TEST_NOTEBOOK={notebook} does not exist")
        shutil.copy2(candidate, served / candidate.name)
    if not (served / candidate.name).is_file():
        pytest.fail(f"{candidate.name} is not in {NOTEBOOKS_DIR}")
    return candidate.name


def _write_lab_settings(settings_dir: Path) -> None:
    """User settings for the throwaway JupyterLab: no news or update checks over the network, and no
    autosave: the test saves once, by hand, after Run All. Under load an autosave raced that save and
    JupyterLab put up "File Changed ... has changed on disk", a dialog that blocked the next click
    (chapter 3, a clone's CI run on 2026-12-07)."""
    notification = settings_dir / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    notification.parent.mkdir(parents=True, exist_ok=True)
    notification.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    docmanager = settings_dir / "@jupyterlab" / "docmanager-extension" / "plugin.jupyterlab-settings"
    docmanager.parent.mkdir(parents=True, exist_ok=True)
    docmanager.write_text(json.dumps({"autosave": False}))


def _stop_server(proc: subprocess.Popen, base_url: str, token: str) -> None:
    """Shut the server and its kernels down: API shutdown, then SIGTERM, then SIGKILL."""
    import psutil

    try:
        descendants = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        descendants = []
    if proc.poll() is None:
        request = urllib.request.Request(
            f"{base_url}/api/shutdown", method="POST", headers={"Authorization": f"token {token}"}
        )
        try:
            urllib.request.urlopen(request, timeout=5).close()
        except (urllib.error.URLError, OSError):
            pass
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
    # Kernels run in their own sessions; end any that outlived the server.
    alive = descendants
    for stop in (psutil.Process.terminate, psutil.Process.kill):
        _, alive = psutil.wait_procs(alive, timeout=5)
        for child in alive:
            try:
                stop(child)
            except psutil.Error:
                pass


def _wait_for_kernel(base_url: str, token: str, notebook: str, timeout_s: float) -> None:
    """Until the notebook's kernel has started and is idle (the server's own view: on a cold
    machine the page shows the notebook long before its kernel can run a cell)."""
    headers = {"Authorization": f"token {token}"}
    deadline, state = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(urllib.request.Request(f"{base_url}/api/sessions", headers=headers),
                                        timeout=10) as r:
                sessions = [s for s in json.loads(r.read()) if s.get("path", "").endswith(notebook)]
            state = sessions[0]["kernel"].get("execution_state") if sessions else None
            if state == "idle":
                return
        except (urllib.error.URLError, OSError, ValueError, KeyError):
            pass
        time.sleep(0.5)
    raise AssertionError(f"{notebook}'s kernel was not idle within {timeout_s} s (last state: {state})")


def _run_all(page) -> None:
    """Run -> Run All Cells, as a learner would."""
    page.locator(f"{PANEL} .jp-Notebook .jp-Cell").first.click()
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()


STARTED_JS = """
(panel) => [...document.querySelectorAll(panel + ' .jp-Notebook .jp-CodeCell .jp-InputPrompt')]
  .some(e => /\\[(\\*|\\d+)\\]/.test(e.textContent))
"""


def _end_kernels(base_url: str, token: str, wait: bool = True) -> None:
    """Shut down every kernel the last chapter started (its ranks with it). A kernel with warm ranks
    takes about 2.6 s to stop; with ``wait=False`` that happens while the next chapter's page and
    kernel load, and :func:`_kernels_ended` waits for it before that chapter's Run All."""
    headers = {"Authorization": f"token {token}"}
    try:  # the sessions now, so that the next chapter's, opened meanwhile, is not among them
        with urllib.request.urlopen(urllib.request.Request(f"{base_url}/api/sessions", headers=headers),
                                    timeout=10) as r:
            sessions = json.loads(r.read())
    except (urllib.error.URLError, OSError, ValueError) as e:
        print(f"could not list the kernels to end: {e}")
        return

    def delete() -> None:
        try:
            for s in sessions:
                urllib.request.urlopen(urllib.request.Request(
                    f"{base_url}/api/sessions/{s['id']}", method="DELETE", headers=headers),
                    timeout=30).close()
        except (urllib.error.URLError, OSError) as e:
            print(f"could not end the kernels: {e}")

    _kernels_ended()
    _ENDING["thread"] = threading.Thread(target=delete, name="end-kernels", daemon=True)
    _ENDING["thread"].start()
    if wait:
        _kernels_ended()


_ENDING: dict[str, threading.Thread] = {}


def _kernels_ended(timeout_s: float = 60) -> None:
    """Wait until the last chapter's kernels have stopped (each DELETE returns once its kernel has)."""
    thread = _ENDING.pop("thread", None)
    if thread is not None:
        thread.join(timeout_s)
        assert not thread.is_alive(), f"the last chapter's kernels did not stop within {timeout_s} s"


@pytest.fixture(params=NOTEBOOKS, ids=lambda name: Path(name).stem[:2])
def jupyter_lab(lab_server, request):
    """The shared JupyterLab, with the chapter under test in its folder; its kernels are shut down
    after the test. Yields (base_url, token, path of the served copy of the notebook under test)."""
    base_url, token, served = lab_server
    notebook = _notebook_to_serve(served, request.param)
    try:
        yield base_url, token, served / notebook
    finally:
        _end_kernels(base_url, token, wait=False)


@pytest.fixture(scope="module")
def chromium():
    """One headless Chromium for the module's tests (each test opens a context of its own): launching
    it took about 1.4 s a chapter."""
    _require_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(scope="module")
def lab_server(tmp_path_factory):
    """One JupyterLab on 127.0.0.1 for every chapter, serving a copy of notebooks/.

    Yields (base_url, token, the served folder).
    """
    _require_browser()
    tmp_path = tmp_path_factory.mktemp("lab")
    served = tmp_path / "notebooks"
    shutil.copytree(NOTEBOOKS_DIR, served, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    if (ROOT / "data").is_dir():  # keep ../data working from the copied notebooks
        (tmp_path / "data").symlink_to(ROOT / "data", target_is_directory=True)

    env = os.environ.copy()
    env.pop("JUPYTER_TOKEN", None)
    dirs = {
        "JUPYTER_CONFIG_DIR": tmp_path / "jupyter-config",
        "JUPYTER_DATA_DIR": tmp_path / "jupyter-data",
        "JUPYTER_RUNTIME_DIR": tmp_path / "jupyter-runtime",
        "JUPYTERLAB_SETTINGS_DIR": tmp_path / "lab-settings",
        "JUPYTERLAB_WORKSPACES_DIR": tmp_path / "lab-workspaces",
        "IPYTHONDIR": tmp_path / "ipython",
    }
    for key, path in dirs.items():
        path.mkdir()
        env[key] = str(path)
    _write_lab_settings(dirs["JUPYTERLAB_SETTINGS_DIR"])

    port = _free_port()
    token = secrets.token_hex(24)
    base_url = f"http://127.0.0.1:{port}"
    command = [
        sys.executable, "-m", "jupyterlab",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        "--port-retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={served}",
        f"--ServerApp.runtime_dir={dirs['JUPYTER_RUNTIME_DIR']}",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        command.append("--allow-root")

    log_path = tmp_path / "jupyterlab.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            command, cwd=served, env=env, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"JupyterLab exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}")
            try:
                with urllib.request.urlopen(f"{base_url}/api/status?token={token}", timeout=2) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(
                    f"JupyterLab did not answer within {SERVER_START_TIMEOUT_S} s:\n"
                    f"{log_path.read_text()[-4000:]}"
                )
            time.sleep(0.5)
        yield base_url, token, served
    finally:
        try:
            _kernels_ended()
        finally:
            _stop_server(proc, base_url, token)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(log_path, ARTIFACTS / "jupyterlab-server.log")


# Picks the control to use and marks its box: the first widget box with an output (an Output or
# HTML child) that answers a dropdown at once (a calculator), else the first explorer with a run
# button (which starts real ranks). Returns "dropdown", "button" or null.
PICK_CONTROL_JS = """
(panel) => {
  const direct = (b, sel) => [...b.children].some(c => c.matches(sel));
  const boxes = [...document.querySelectorAll(panel + ' .jp-OutputArea-output .widget-vbox')]
    .filter(b => direct(b, '.widget-output, .widget-html'));
  const instant = boxes.find(b => !b.querySelector('button.jupyter-button') &&
                                  b.querySelector('.widget-dropdown select'));
  const run = boxes.find(b => direct(b, 'button.jupyter-button.mod-primary'));
  const pick = instant || run;
  if (!pick) return null;
  pick.setAttribute('data-test-control', '1');
  return instant ? 'dropdown' : 'button';
}
"""
CONTROL_OUTPUT_JS = """
() => {
  const box = document.querySelector('[data-test-control]');
  const out = box && [...box.children].find(c => c.matches('.widget-output, .widget-html'));
  return out ? out.innerHTML : null;
}
"""
# An animated figure (frames, a slider and a play button): the slider's active step, or null.
ANIMATION_VALUE_JS = """
(panel) => {
  const plot = document.querySelector('[data-test-animation]') ||
    [...document.querySelectorAll(panel + ' .js-plotly-plot')]
      .find(p => p._fullLayout?.sliders?.length && p._transitionData?._frames?.length &&
                 p.querySelector('.updatemenu-button'));
  if (!plot) return null;
  plot.setAttribute('data-test-animation', '1');
  return plot._fullLayout.sliders[0].active;
}
"""
# The page-wide copies of plotly's widget module (lesson_lib/plots/live.py) and the figures drawn by
# widgets: one copy for them all, where anywidget alone would evaluate plotly.js once per figure.
SHARED_PLOTLY_JS = """(panel) => ({
  copies: Object.keys(globalThis).filter((k) => k.startsWith('lesson_lib:plotly-widget:')).length,
  widget_figures: document.querySelectorAll(panel + ' .js-plotly-plot:not(.jp-RenderedPlotly)').length,
})"""  # a figure of plotly's mimetype renderer is .jp-RenderedPlotly; a FigureWidget's is not
ANIMATED = {"02"}  # chapters that must have an animation for the test to play (the ring, step by step)
# Console errors that are not the page's: a resource JupyterLab tries offline.
BENIGN_CONSOLE = re.compile(r"Failed to load resource|net::ERR_")
# anywidget gives a model 2 s to initialise (AbortSignal.timeout(2000) in its runtime) and logs this
# when it takes longer, as a FigureWidget importing plotly.js (about 5 MB) did on a loaded machine. A
# live figure now returns within 1 s (lesson_lib/plots/live.py), but a page too busy to run its timers
# can still pass 2 s. Tolerated only when every widget output was drawn (checked below).
ANYWIDGET_SLOW = "[anywidget] Failed to initialize model."
EMPTY_WIDGET_OUTPUTS_JS = """(root) => {
  const cells = [...document.querySelectorAll(root + ' .jp-Cell')];
  return [...document.querySelectorAll(root + ' .jp-OutputArea-output')]
    .filter((o) => o.querySelector('.jupyter-widgets, .js-plotly-plot')
                   || /widget-view/.test(o.dataset.mimeType || ''))
    .filter((o) => o.getBoundingClientRect().height < 5 || /Loading widget/.test(o.textContent))
    .map((o) => cells.indexOf(o.closest('.jp-Cell')));
}"""


def _use_a_control(page) -> str:
    """Use the chapter's control (see PICK_CONTROL_JS) and wait until its output has changed and
    the kernel is idle again. Returns what was used."""
    kind = page.evaluate(PICK_CONTROL_JS, PANEL)
    assert kind, "no control with an output found (a calculator or an explorer)"
    before = page.evaluate(CONTROL_OUTPUT_JS)
    box = page.locator("[data-test-control]")
    if kind == "dropdown":
        select = box.locator(".widget-dropdown select").first
        options = select.locator("option").all_text_contents()
        current = select.evaluate("s => s.selectedIndex")
        select.select_option(index=(current + 1) % len(options))
        used = f"dropdown → {options[(current + 1) % len(options)]}"
    else:
        button = box.locator(":scope > button.jupyter-button.mod-primary").first
        used = f"button {button.text_content()!r}"
        button.click()
    page.wait_for_function(
        """([panel, before]) => {
             const box = document.querySelector('[data-test-control]');
             const out = [...box.children].find(c => c.matches('.widget-output, .widget-html'));
             const idle = document.querySelector(panel + ' .jp-Notebook-ExecutionIndicator')
               ?.getAttribute('data-status') === 'idle';
             return idle && out.innerHTML !== before && out.textContent.trim() !== '';
           }""",
        arg=[PANEL, before], timeout=CONTROL_TIMEOUT_S * 1000, polling=500)
    # The kernel is done; plotly draws its figures after that. Wait until the output holds still.
    after, still, deadline = None, 0, time.monotonic() + 30
    while still < 4 and time.monotonic() < deadline:  # the same for 4 reads in a row, 1 s
        now = page.evaluate(CONTROL_OUTPUT_JS)
        still, after = (still + 1 if now == after else 0), now
        page.wait_for_timeout(250)
    assert "Traceback" not in after, f"using the {used} raised:\n{after[-2000:]}"
    return used


def _play_an_animation(page, chapter: str) -> str | None:
    """Press an animated figure's first button (Play) and wait for its slider to move."""
    start = page.evaluate(ANIMATION_VALUE_JS, PANEL)
    if start is None:
        assert chapter not in ANIMATED, f"chapter {chapter}'s animation is missing"
        return None
    plot = page.locator("[data-test-animation]")
    plot.scroll_into_view_if_needed()
    plot.locator(".updatemenu-button").first.click()
    page.wait_for_function(
        "(start) => document.querySelector('[data-test-animation]')._fullLayout.sliders[0].active !== start",
        arg=start, timeout=15_000, polling=200)
    return f"slider step {start} → {page.evaluate(ANIMATION_VALUE_JS, PANEL)}"


def _code_cells(notebook: dict) -> list[tuple[int, dict]]:
    """(index, cell) of every non-empty code cell."""
    return [
        (i, c) for i, c in enumerate(notebook.get("cells", []))
        if c.get("cell_type") == "code" and "".join(c.get("source", "")).strip()
    ]


def _error_outputs(notebook: dict) -> list[str]:
    """Tracebacks of error outputs, except in cells tagged raises-exception."""
    errors = []
    for index, cell in enumerate(notebook.get("cells", [])):
        if "raises-exception" in cell.get("metadata", {}).get("tags", []):
            continue
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                text = ANSI_ESCAPE.sub("", "\n".join(output.get("traceback", [])))
                errors.append(f"cell {index}: {output.get('ename')}: {output.get('evalue')}\n{text[-2000:]}")
    return errors


def _save_and_read(page, path: Path, timeout_s: float = 30) -> dict:
    """File -> Save Notebook in the browser, then read the saved file."""
    before = path.stat().st_mtime_ns
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^File$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Save Notebook$")).click()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.stat().st_mtime_ns != before:
            try:
                return json.loads(path.read_text(encoding="utf-8"))
            except ValueError:  # caught mid-write
                pass
        time.sleep(0.25)
    raise AssertionError(f"JupyterLab did not save {path.name} within {timeout_s} s")


def _screenshot_whole_notebook(page, path: Path) -> None:
    """Grow the viewport to the notebook's height so one screenshot shows every cell."""
    height = page.evaluate(
        """(panel) => {
             const s = document.querySelector(panel + ' .jp-WindowedPanel-outer');
             return s ? s.scrollHeight + s.getBoundingClientRect().top + 40 : 0;
           }""",
        PANEL,
    )
    height = int(min(max(height or 0, VIEWPORT["height"]), MAX_SCREENSHOT_HEIGHT))
    page.set_viewport_size({"width": VIEWPORT["width"], "height": height})
    page.evaluate(
        "(panel) => { const s = document.querySelector(panel + ' .jp-WindowedPanel-outer');"
        " if (s) s.scrollTop = 0; }",
        PANEL,
    )
    page.wait_for_timeout(1000)  # let plotly and the notebook re-layout
    page.screenshot(path=str(path), full_page=True)
    page.set_viewport_size(VIEWPORT)


def _machine() -> str:
    """The OS, architecture and CPU model, for the Run All table (benchmarks/run_all_table.py)."""
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return ", ".join(x for x in (f"{platform.system()} {platform.machine()}", cpu) if x)


def _record_run_all(notebook: str, run_all_s: float, control_s: float, total_s: float,
                    load: float | None) -> None:
    """Merge this chapter's passing run into RUN_ALL_TIMES, one entry per notebook (the latest run):
    `python benchmarks/run_all_table.py` renders the file as benchmarks/run-all.md."""
    try:
        times = json.loads(RUN_ALL_TIMES.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        times = {}
    one = os.environ.get("BROWSER_TEST_NOTEBOOK")
    times[notebook] = {
        "run_all_s": round(run_all_s, 1),
        "control_s": round(control_s, 1),
        "open_to_control_s": round(total_s, 1),  # the page opened, the kernel, Run All, the control
        "date": time.strftime("%Y-%m-%d"),
        "nproc": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "load_1min": None if load is None else round(load, 2),  # before Run All: other jobs on the machine
        "ci": bool(os.environ.get("CI")),
        "machine": _machine(),
        "command": f"BROWSER_TEST_NOTEBOOK={one} pytest tests/test_browser.py" if one else "make test",
    }
    tmp = RUN_ALL_TIMES.with_suffix(".tmp")
    tmp.write_text(json.dumps(dict(sorted(times.items())), indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, RUN_ALL_TIMES)


def test_notebook_runs_in_jupyterlab(jupyter_lab, chromium):
    base_url, token, served_notebook = jupyter_lab
    notebook = served_notebook.name
    stem = Path(notebook).stem
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    screenshot = ARTIFACTS / f"{stem}.png"
    page_errors: list[str] = []
    console_errors: list[str] = []

    context = chromium.new_context(viewport=VIEWPORT)
    try:
        page = context.new_page()
        page.on("pageerror", lambda error: page_errors.append(str(error)))
        page.on("console", lambda m: console_errors.append(m.text)
                if m.type == "error" and not BENIGN_CONSOLE.search(m.text) else None)
        page.set_default_timeout(30_000)
        received = {"bytes": 0, "large": 0}  # the kernel's messages to the page, and those over 4 MB

        def on_frame(payload) -> None:
            received["bytes"] += len(payload)
            received["large"] += len(payload) > 4e6

        page.on("websocket", lambda ws: ws.on("framereceived", on_frame))
        try:
            # A workspace of the chapter's own, so the last chapter's notebook is not reopened
            # beside it (not ?reset: JupyterLab reloads the page for it, racing the clicks below).
            opened = time.monotonic()
            page.goto(f"{base_url}/lab/workspaces/{stem}/tree/{notebook}?token={token}",
                      wait_until="domcontentloaded")

            page.locator(f"{PANEL} .jp-Notebook .jp-Cell").first.wait_for(
                state="visible", timeout=NOTEBOOK_LOAD_TIMEOUT_S * 1000
            )
            # A notebook without kernelspec metadata asks for a kernel: accept the default.
            select_kernel = page.locator(".jp-Dialog .jp-mod-accept")
            page.wait_for_timeout(500)
            if select_kernel.count():
                select_kernel.first.click()
            page.locator(f'{PANEL} .jp-Notebook-ExecutionIndicator[data-status="idle"]').wait_for(
                state="attached", timeout=NOTEBOOK_LOAD_TIMEOUT_S * 1000
            )
            _wait_for_kernel(base_url, token, notebook, NOTEBOOK_LOAD_TIMEOUT_S)
            _kernels_ended()  # the last chapter's ranks are gone before this one's Run All

            load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
            started = time.monotonic()
            _run_all(page)
            try:  # a click the page was not ready for starts nothing: then once more
                page.wait_for_function(STARTED_JS, arg=PANEL, timeout=30_000, polling=500)
            except Exception:
                print("Run All started no cell within 30 s: clicking it again")
                _run_all(page)

            page.wait_for_function(RUN_FINISHED_JS, arg=PANEL, timeout=RUN_ALL_TIMEOUT_S * 1000,
                                   polling=500)
            run_all_s = time.monotonic() - started
            print(f"Run All Cells finished in {run_all_s:.1f} s")
            page.wait_for_timeout(1500)  # let late renderers (plotly, widgets) finish

            # Save the served copy (never the repository's notebook) and read which
            # cells raised: only error outputs, not tracebacks printed on purpose.
            saved = _save_and_read(page, served_notebook)
            errors = _error_outputs(saved)
            assert not errors, "cells raised errors:\n" + "\n---\n".join(errors)
            not_run = [i for i, c in _code_cells(saved) if c.get("execution_count") is None]
            assert not not_run, f"code cells not executed: {not_run}"
            prompts = page.evaluate(PROMPTS_JS, PANEL)
            assert prompts and not any("*" in p for p in prompts), f"prompts after run: {prompts}"

            # Plotly's mimetype renderer puts .js-plotly-plot on the output itself;
            # a FigureWidget nests it inside the widget view. Both match here.
            plots = page.locator(f"{PANEL} .jp-OutputArea .js-plotly-plot").filter(
                has=page.locator(".main-svg")
            )
            assert plots.count() > 0, "no plotly figure rendered"
            plots.first.scroll_into_view_if_needed()
            box = plots.first.locator(".main-svg").first.bounding_box()
            assert box and box["width"] > 100 and box["height"] > 100, f"plotly figure too small: {box}"
            plots.first.screenshot(path=str(ARTIFACTS / f"{stem}-plot.png"))
            # every figure shows what its title says: data inside the axes, log axes no more than a
            # decade past the data, no empty subplot, every axis titled (tests/figure_checks.js)
            bad_figures = page.evaluate(FIGURE_CHECKS_JS, PANEL)
            if bad_figures:  # a FigureWidget being redrawn is briefly empty: keep what persists
                page.wait_for_timeout(3000)
                bad_figures = [b for b in page.evaluate(FIGURE_CHECKS_JS, PANEL) if b in bad_figures]
            assert not bad_figures, "figures that hide data or text:\n" + "\n".join(bad_figures)
            # every live figure shares one copy of plotly's widget module (lesson_lib/plots/live.py)
            shared = page.evaluate(SHARED_PLOTLY_JS, PANEL)
            assert shared["copies"] == (1 if shared["widget_figures"] else 0), shared
            # and it crossed the websocket once: plotly.js is 4.96 MB; each FigureWidget sent it before
            print(f"received over the websockets: {received['bytes'] / 1e6:.1f} MB")
            assert received["large"] <= 1, f"{received['large']} messages over 4 MB: plotly.js again?"

            # ipywidgets shows "Error displaying widget" (also with class jupyter-widgets)
            # when the widget manager cannot render a model.
            broken = page.locator(f"{PANEL} .jp-OutputArea-output", has_text="Error displaying widget")
            assert broken.count() == 0, broken.first.text_content()
            widgets = page.locator(
                f"{PANEL} .jp-OutputArea-output .jupyter-widgets, "
                f"{PANEL} .jp-OutputArea-output .widget-slider, "
                f"{PANEL} .jp-OutputArea-output .widget-dropdown"
            ).filter(has_not_text="Loading widget")
            assert widgets.count() > 0, "no ipywidgets widget rendered"
            widgets.first.scroll_into_view_if_needed()
            box = widgets.first.bounding_box()
            assert box and box["width"] > 20 and box["height"] > 10, f"widget not visible: {box}"
            widgets.first.screenshot(path=str(ARTIFACTS / f"{stem}-widget.png"))

            played = _play_an_animation(page, stem[:2])
            if played:
                print(f"animation played: {played}")
            started = time.monotonic()
            used = _use_a_control(page)
            control_s = time.monotonic() - started
            print(f"control used: {used}; its output changed in {control_s:.1f} s")
            total_s = time.monotonic() - opened  # the page opened, the kernel, Run All, the control
            with open(ARTIFACTS / "timings.tsv", "a") as f:  # every run that got this far, one line each
                f.write(f"{stem}\t{run_all_s:.1f}\t{control_s:.1f}\t{total_s:.1f}\t{used}\n")
            page.locator("[data-test-control]").screenshot(path=str(ARTIFACTS / f"{stem}-control.png"))
            # anywidget's rejection arrives as an uncaught error (its promise) or a console error
            slow = [e for e in page_errors + console_errors if e.strip() == ANYWIDGET_SLOW]
            if slow:
                empty = page.evaluate(EMPTY_WIDGET_OUTPUTS_JS, PANEL)
                assert not empty, f"{ANYWIDGET_SLOW} and widget outputs left empty in cells {empty}"
                print(f"{len(slow)} x {ANYWIDGET_SLOW!r} (anywidget's 2 s limit); every widget drawn")
                page_errors[:] = [e for e in page_errors if e.strip() != ANYWIDGET_SLOW]
                console_errors[:] = [e for e in console_errors if e.strip() != ANYWIDGET_SLOW]
            assert not page_errors, "uncaught errors in the page:\n" + "\n".join(page_errors)
            assert not console_errors, "the browser console logged errors:\n" + "\n".join(console_errors)
            _record_run_all(notebook, run_all_s, control_s, total_s, load_before)
        finally:
            try:
                _screenshot_whole_notebook(page, screenshot)
            except Exception as error:  # never hide the real failure
                print(f"could not take screenshot {screenshot}: {error}")
            (ARTIFACTS / f"{stem}-page-errors.log").write_text("\n".join(page_errors + console_errors))
    finally:
        context.close()


# The fallback of lesson_lib/plots/live.py: the live figure that carries plotly's widget module to the
# page is closed before the page loaded it, so the figure shown must ask its kernel for a copy, and
# must keep the updates that the kernel sent while it waited, each applied once.
CARRIER_CLOSED_CELLS = [
    "from lesson_lib.plots.live import LiveFigure\n"
    "a = LiveFigure({'data': [{'type': 'bar', 'y': [1, 2]}]})\n"
    "b = LiveFigure({'data': [{'type': 'scatter', 'y': [3, 1, 2]}]})\n"
    "b",
    "a.close()\nb.data[0].y = [5, 4, 5]\nb.add_scatter(y=[1, 1, 1])\nb.layout.title = 'updated'",
]
WIDGET_FIGURE_DATA_JS = """(panel) =>
  [...document.querySelectorAll(panel + ' .js-plotly-plot:not(.jp-RenderedPlotly)')]
  .map((p) => ({y: p.data && p.data[0] && [...p.data[0].y], traces: p.data && p.data.length,
                title: p.layout && p.layout.title}))"""


def test_a_live_figure_draws_itself_when_the_figure_carrying_plotly_was_closed(lab_server, chromium):
    base_url, token, served = lab_server
    notebook = "live_carrier_closed.ipynb"
    cells = [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": s}
             for s in CARRIER_CLOSED_CELLS]
    (served / notebook).write_text(json.dumps({
        "cells": cells, "nbformat": 4, "nbformat_minor": 5,
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}}))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    try:
        context = chromium.new_context(viewport=VIEWPORT)
        try:
            page = context.new_page()
            page.goto(f"{base_url}/lab/workspaces/carrier/tree/{notebook}?token={token}",
                      wait_until="domcontentloaded")
            page.locator(f"{PANEL} .jp-Notebook .jp-Cell").first.wait_for(
                state="visible", timeout=NOTEBOOK_LOAD_TIMEOUT_S * 1000)
            _wait_for_kernel(base_url, token, notebook, NOTEBOOK_LOAD_TIMEOUT_S)
            _kernels_ended()
            _run_all(page)
            page.wait_for_function(RUN_FINISHED_JS, arg=PANEL, timeout=120_000, polling=500)
            try:  # drawn from the copy the kernel sent, with the two updates made meanwhile
                page.wait_for_function(
                    f"(panel) => {{ const f = ({WIDGET_FIGURE_DATA_JS})(panel);"
                    " return f.length === 1 && JSON.stringify(f[0].y) === '[5,4,5]'; }",
                    arg=PANEL, timeout=60_000, polling=500)
            finally:
                page.screenshot(path=str(ARTIFACTS / "live-carrier-closed.png"))
            figures = page.evaluate(WIDGET_FIGURE_DATA_JS, PANEL)
            assert figures[0]["title"]["text"] == "updated" and figures[0]["traces"] == 2, figures
            assert page.evaluate(SHARED_PLOTLY_JS, PANEL)["copies"] == 1
        finally:
            context.close()
    finally:
        _end_kernels(base_url, token)
