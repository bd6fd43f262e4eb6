# DNN Computing on GPUs. Every target sets up .venv itself (once, and again when a requirements file changes).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
READY := $(VENV)/.ready
COLAB_VENV := .venv-colab
COLAB_READY := $(COLAB_VENV)/.ready
BUILD_FLAGS := -n -W --keep-going

.PHONY: book test lint labs cells gpu-run gpu-parallel serve clean

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

# The Jupyter widgets HTML manager, fetched from npm and checked against this hash of its tarball: its standalone
# embed.js (no require.js) draws the notebooks' saved widget views; book/_ext/widget_views.py serves it from _static/.
HTML_MANAGER := 1.0.15
HTML_MANAGER_SHA512 := e6d841215eb298d8263d5387bf3c7e806cbc6522a649ace1b46c38fdce312435734611bd3d3790b118c5dc5513a29bc58bffd200178dcf5ca9e3b6c2ac9dc240
WIDGETS := book/_vendor/html-manager

$(WIDGETS)/embed.js: Makefile $(READY)
	rm -rf $(WIDGETS) && mkdir -p $(WIDGETS)/npm
	cd $(WIDGETS)/npm && npm pack --silent @jupyter-widgets/html-manager@$(HTML_MANAGER) >/dev/null
	echo "$(HTML_MANAGER_SHA512)  $(WIDGETS)/npm/jupyter-widgets-html-manager-$(HTML_MANAGER).tgz" | sha512sum -c --quiet
	tar -xzf $(WIDGETS)/npm/jupyter-widgets-html-manager-$(HTML_MANAGER).tgz -C $(WIDGETS)/npm
	cp $(WIDGETS)/npm/package/dist/embed.js.LICENSE.txt $(WIDGETS)/npm/package/dist/*.woff2 $(WIDGETS)/
	cp $(VENV)/lib/python3*/site-packages/ipywidgets-*.dist-info/licenses/LICENSE $(WIDGETS)/LICENSE
	mv $(WIDGETS)/npm/package/dist/embed.js $@ && rm -rf $(WIDGETS)/npm && touch $@

# plotly.js's cartesian bundle (scatter, bar, heatmap, box, histogram, contour, pie...: every trace the book draws,
# at a third of the full library's 4.8 MB), from npm and checked against this hash. Its version must be the one the
# installed plotly package writes figures for: book/_ext/page_scripts.py stops the build if they differ.
PLOTLY_JS := 4.1.1
PLOTLY_JS_SHA512 := a3c1ab15ebac9dcc012316c1ca7449a58e29920541e9c68cf892e9c2b2d86dbb0eedd67c149f9254dd85afe2fb9221bf67ac383f93b426eb3f42be4479f1d57a
PLOTLY_DIR := book/_vendor/plotly

$(PLOTLY_DIR)/plotly-cartesian.min.js: Makefile
	rm -rf $(PLOTLY_DIR) && mkdir -p $(PLOTLY_DIR)/npm
	cd $(PLOTLY_DIR)/npm && npm pack --silent plotly.js-cartesian-dist-min@$(PLOTLY_JS) >/dev/null
	echo "$(PLOTLY_JS_SHA512)  $(PLOTLY_DIR)/npm/plotly.js-cartesian-dist-min-$(PLOTLY_JS).tgz" | sha512sum -c --quiet
	tar -xzf $(PLOTLY_DIR)/npm/plotly.js-cartesian-dist-min-$(PLOTLY_JS).tgz -C $(PLOTLY_DIR)/npm
	cp $(PLOTLY_DIR)/npm/package/LICENSE $(PLOTLY_DIR)/LICENSE
	mv $(PLOTLY_DIR)/npm/package/plotly-cartesian.min.js $@ && rm -rf $(PLOTLY_DIR)/npm && touch $@

## book: run every notebook and build the HTML into _build/html
book: $(READY) $(WIDGETS)/embed.js $(PLOTLY_DIR)/plotly-cartesian.min.js
	GPULAB_BOOK_BUILD=1 $(VENV)/bin/jupyter-book build . --path-output . $(BUILD_FLAGS)

## test: every check CI runs, with each stage's time (the colab stage runs the notebooks in .venv-colab)
test: $(READY) $(COLAB_READY) $(WIDGETS)/embed.js $(PLOTLY_DIR)/plotly-cartesian.min.js
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

## gpu-parallel: on a machine of 2, 4 or 8 GPUs, record chapter 16's tensor, pipeline and sharded parallelism
gpu-parallel:
	PYTHONPATH=$(CURDIR)/src $(PYTHON) tools/record_parallelism.py

## serve: serve the built book on http://localhost:8000
serve:
	$(PYTHON) -m http.server --directory _build/html 8000

clean:
	rm -rf _build
