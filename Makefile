# Course tooling. `make test` is what CI runs (through .ci/run).
PYTHON ?= python3
VENV ?= .venv

BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# torch is pinned (tests/test_packaging.py keeps this in step with pyproject.toml). On Linux pip's
# default torch wheel bundles several GB of CUDA libraries; with no NVIDIA GPU (no nvidia-smi) we
# take PyTorch's CPU-only build from its own index instead. Override: `make install TORCH_INDEX=URL`,
# or `TORCH_INDEX=` (empty) for pip's default. Where that index cannot be reached, pip warns, retries
# for a few seconds and carries on with the indexes it has. torch alone comes from there (--no-deps):
# its dependencies come with the project's, from the usual index.
TORCH_VERSION := 2.13.0
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
ifeq ($(origin TORCH_INDEX), undefined)
TORCH_INDEX := $(shell if [ "$$(uname -s)" = Linux ] && ! command -v nvidia-smi >/dev/null 2>&1; then echo $(TORCH_CPU_INDEX); fi)
endif

.PHONY: install test test-quick test-mutants test-numerics lint lab bench site clean-notebooks sync-notebooks \
	workshop wheelhouse

# Offline: `make install WHEELHOUSE=dir` installs from a folder that `make wheelhouse` wrote, with pip's
# --no-index (no network at all); without it, torch comes from TORCH_INDEX and the rest from PyPI.
TORCH_SOURCE = $(if $(WHEELHOUSE),--no-index --find-links $(WHEELHOUSE),$(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)))
PIP_SOURCE = $(if $(WHEELHOUSE),--no-index --find-links $(WHEELHOUSE))

# Idempotent: the venv is created only when missing, and the editable install is
# redone only when pyproject.toml is newer than the stamp file.
install: $(STAMP)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	@echo "make install: torch $(TORCH_VERSION) from $(if $(WHEELHOUSE),$(WHEELHOUSE) only (no network),$(if $(TORCH_INDEX),$(TORCH_INDEX) (CPU-only build: no NVIDIA GPU found) or PyPI,PyPI (pip's default build)))"
	$(BIN)/pip install --no-deps "torch==$(TORCH_VERSION)" $(TORCH_SOURCE)
	$(BIN)/pip install $(PIP_SOURCE) -e ".[dev]"
	touch $@

lint: install
	$(BIN)/ruff check .

# Every notebook runs in a real JupyterLab with this CPU's kernels (tests/test_browser.py: Run All,
# one chapter after another; figures drawn, widgets rendered, a control used, no errors). Then the
# numerically sensitive tests run again under ATen's portable kernels (no AVX2/AVX-512), so that a
# tolerance that only holds for one CPU's kernels fails here rather than on a learner's laptop, and
# so do chapters 4 and 6 whole, under nbval (their timelines and PowerSGD's orthogonalisation change
# with the kernels). Chapters 0, 3 and 5 make their float comparisons through lesson_lib.numerics
# with the same configurations as tests marked `numerics`, which are what reruns for them: run whole
# they took 29 + 96 + 173 s under nbclient on a slow 2-core machine, where `pytest tests` alone took
# 1,568 s and `make test` with them ran past .ci/run's 1,800 s cap. (`pytest` alone runs nbval on
# every notebook with this machine's kernels: testpaths.)
test: install
	$(BIN)/ruff check .
	$(BIN)/python -m pytest tests
	$(MAKE) --no-print-directory test-numerics

# The quick loop while editing: ruff and the unit tests only — no notebooks, no browser, no CLI or
# torchrun subprocesses, no timeouts waited out (those are marked slow). Every chapter's checkers, right
# and wrong answers, run here. pytest took 115 s for 1,736 tests on 2 quiet cores (2026-12-05) and 234 s
# for 2,096 on another quiet 2-core machine (2026-12-07; 334 s before workers stopped importing plotly's
# renderers): the goal is 2 minutes. benchmarks/test-times.md shows which files cost the most.
test-quick: install
	$(BIN)/ruff check .
	$(BIN)/python -m pytest tests -m "not slow and not browser" -p no:cacheprovider

# Does the suite bite? A handful of one-line bugs (tests/mutants.py), each applied to a temporary
# copy and run against the quick loop: prints caught/missed. Not part of `make test` (a missed mutant
# costs a whole quick loop); record a run in benchmarks/mutants.md.
test-mutants: install
	$(BIN)/python tests/mutants.py --json artifacts/mutants.json

NUMERIC_NOTEBOOKS := notebooks/04_zero.ipynb notebooks/06_compression.ipynb
test-numerics: install
	ATEN_CPU_CAPABILITY=default $(BIN)/python -m pytest -m numerics tests
	ATEN_CPU_CAPABILITY=default $(BIN)/python -m pytest $(NUMERIC_NOTEBOOKS)

# Token auth stays on: open the URL with ?token=... that JupyterLab prints. It opens on the course's
# table of contents (notebooks/README.md, shown rendered: this venv's JupyterLab opens Markdown
# files in the preview by default).
LAB_OVERRIDES := $(VENV)/share/jupyter/lab/settings/overrides.json
lab: install
	@mkdir -p $(dir $(LAB_OVERRIDES)); \
	echo '{"@jupyterlab/docmanager-extension:plugin": {"defaultViewers": {"markdown": "Markdown Preview"}}, "@jupyterlab/apputils-extension:notification": {"fetchNews": "false"}}' > $(LAB_OVERRIDES); \
	extra=""; if [ "$$(id -u)" = "0" ]; then extra="--allow-root"; fi; \
	cmd="$(BIN)/jupyter lab --ip=127.0.0.1 --notebook-dir=notebooks --no-browser --LabApp.default_url=/lab/tree/README.md $$extra"; \
	echo "$$cmd"; exec $$cmd

# A JupyterHub for a room, on this machine, as root (docs/workshop.md): `make workshop
# LEARNERS=names.txt`; the rest of the options go in WORKSHOP_ARGS (`--ip 0.0.0.0 --password-file F`).
workshop: install
	$(BIN)/python -m lesson_lib workshop serve $(if $(LEARNERS),--learners $(LEARNERS)) $(WORKSHOP_ARGS)

# Every wheel the course needs (dev and workshop extras, torch from where `make install` takes it, the
# build backend an editable install needs), for this machine's OS, CPU and Python: carry the folder to
# a room without network, then `make install WHEELHOUSE=dir` or `workshop serve --wheelhouse dir`.
# Into build/wheelhouse, or `make wheelhouse WHEELHOUSE=dir`. pip wheel builds any sdist into a wheel.
WHEELHOUSE_DIR = $(or $(WHEELHOUSE),build/wheelhouse)
wheelhouse:
	mkdir -p $(WHEELHOUSE_DIR)
	$(PYTHON) -m pip download --no-deps "torch==$(TORCH_VERSION)" $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) -d $(WHEELHOUSE_DIR)
	$(PYTHON) -m pip wheel --find-links $(WHEELHOUSE_DIR) -w $(WHEELHOUSE_DIR) ".[dev,workshop]" "setuptools>=68"
	rm -f $(WHEELHOUSE_DIR)/lesson_lib-*.whl  # the course installs from its checkout
	@echo "make wheelhouse: $$(ls $(WHEELHOUSE_DIR) | wc -l) wheels in $(WHEELHOUSE_DIR)"

# The rendered course: every chapter executed (its real ranks run, as Run All does) and exported to
# static HTML in build/site, figures interactive, offline; the table of contents is index.html.
# `make site CHAPTERS="00 07"` builds only those. Publish by copying build/site to any static host.
site: install
	$(BIN)/python -m lesson_lib.site --out build/site $(if $(CHAPTERS),--chapters $(CHAPTERS))

# Every benchmark in benchmarks/ (minutes each); record results in a dated file there.
bench: install
	for b in startup allreduce compression ddp bubble; do $(BIN)/python -m lesson_lib bench $$b || exit 1; done

# Strip outputs, execution counts, execution timings and saved widget state so
# notebooks are stored clean (checked by tests/test_packaging.py). Standard library
# only; keys keep their order and the layout is nbformat's (indent 1), so only the
# stripped fields show in a diff. Files that are already clean are left untouched.
define CLEAN_NOTEBOOKS_PY
import glob, json
changed = 0
for path in sorted(glob.glob("notebooks/*.ipynb")):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    nb = json.loads(text)
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
            cell.get("metadata", {}).pop("execution", None)
    nb.get("metadata", {}).pop("widgets", None)
    new = json.dumps(nb, indent=1, ensure_ascii=False) + "\n"
    if new != text:
        with open(path, "w", encoding="utf-8") as f:
            f.write(new)
        changed += 1
        print("cleaned", path)
print(f"clean-notebooks: {changed} notebook(s) changed")
endef
export CLEAN_NOTEBOOKS_PY

clean-notebooks:
	$(PYTHON) -c "$$CLEAN_NOTEBOOKS_PY"

# Each notebook is paired with a percent-format script (notebooks/scripts/NN_name.py) by jupytext: edit
# either (JupyterLab keeps the pair in step when jupytext is installed, as it is here), then sync.
sync-notebooks: install
	$(BIN)/jupytext --sync notebooks/[0-9]*.ipynb notebooks/the_room_learner.ipynb
	$(MAKE) --no-print-directory clean-notebooks
