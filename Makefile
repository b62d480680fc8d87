# Course tooling. `make test` is what CI runs (through .ci/run).
PYTHON ?= python3
VENV ?= .venv

BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test lint lab bench clean-notebooks

# Idempotent: the venv is created only when missing, and the editable install is
# redone only when pyproject.toml is newer than the stamp file.
install: $(STAMP)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -e ".[dev]"
	touch $@

lint: install
	$(BIN)/ruff check .

# testpaths (tests, notebooks) and --nbval-lax come from pyproject.toml.
test: install
	$(BIN)/ruff check .
	$(BIN)/python -m pytest

# Token auth stays on: open the URL with ?token=... that JupyterLab prints.
lab: install
	@extra=""; if [ "$$(id -u)" = "0" ]; then extra="--allow-root"; fi; \
	echo "$(BIN)/jupyter lab --ip=127.0.0.1 --notebook-dir=notebooks --no-browser $$extra"; \
	exec $(BIN)/jupyter lab --ip=127.0.0.1 --notebook-dir=notebooks --no-browser $$extra

bench: install
	$(BIN)/python -m lesson_lib bench startup
	$(BIN)/python -m lesson_lib bench allreduce

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
