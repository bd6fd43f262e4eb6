# DNN Computing on GPUs. Every target sets up .venv itself (once, and again when a requirements file changes).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
READY := $(VENV)/.ready
COLAB_VENV := .venv-colab
COLAB_READY := $(COLAB_VENV)/.ready
BUILD_FLAGS := -n -W --keep-going

.PHONY: book test lint labs cells gpu-run serve clean

$(READY): requirements.txt requirements-test.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt -r requirements-test.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $@

# The second environment: Colab's widget, kernel and plotting versions (requirements-colab.txt).
$(COLAB_READY): requirements-colab.txt pyproject.toml
	$(PYTHON) -m venv $(COLAB_VENV)
	$(COLAB_VENV)/bin/python -m pip install -q --upgrade pip
	$(COLAB_VENV)/bin/python -m pip install -q -r requirements-colab.txt
	$(COLAB_VENV)/bin/python -m pip install -q --no-deps -e .
	touch $@

## book: run every notebook and build the HTML into _build/html
book: $(READY)
	$(VENV)/bin/jupyter-book build . --path-output . $(BUILD_FLAGS)

## test: every check CI runs, with each stage's time (the colab stage runs the notebooks in .venv-colab)
test: $(READY) $(COLAB_READY)
	$(PY) tools/run_tests.py

## lint: ruff on the library, tests, tools and notebooks
lint: $(READY)
	$(VENV)/bin/ruff check src tests tools book/_ext notebooks labs

## labs: regenerate the labs' student versions from labs/solutions/
labs: $(READY)
	$(PY) tools/make_labs.py

## cells: stamp the shared setup cell (with the repository URL of _config.yml) into every notebook
cells: $(READY)
	$(PY) tools/notebook_cells.py

## gpu-run: on a GPU machine, run every notebook at full size and refresh results/<gpu>/ (no .venv: uses python3)
gpu-run:
	$(PYTHON) tools/gpu_run.py

## serve: serve the built book on http://localhost:8000
serve:
	$(PYTHON) -m http.server --directory _build/html 8000

clean:
	rm -rf _build
