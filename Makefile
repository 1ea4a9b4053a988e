# Every target refreshes .venv when pyproject.toml changes, then acts.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test quick e2e lint bench lock manifests clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/gpupack serve --cluster-file manifests/examples/cluster.yaml

test: $(STAMP)
	$(PY) -m pytest --ignore=tests/e2e

# the edit-test loop: make test without the tests marked slow (property, fuzz, soak, subprocess start-ups)
quick: $(STAMP)
	$(PY) -m pytest --ignore=tests/e2e -m "not slow"

# etcd, the real kube-apiserver and kube-scheduler of each release in the matrix, gpupack serve, and a
# real node (gpupack on it from manifests/ and from the Helm chart); Kubernetes programs and helm missing from
# ~/.cache/gpupack/kube and ~/.cache/gpupack/helm are built first from Go modules
e2e: $(STAMP)
	$(PY) -m gpupack.harness.kube_programs
	$(PY) -m gpupack.harness.helm_program
	$(PY) -m pytest tests/e2e

# ruff, then mypy over the package and tests, each module under its installed gpupack.* name (.ci/typecheck.py)
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) .ci/typecheck.py tests .ci/typecheck.py

# requirements.lock: every runtime dependency of the image at one version, with the hashes of its files
# (the Dockerfile installs with --require-hashes); run after changing pyproject.toml's dependencies
lock: $(STAMP)
	CUSTOM_COMPILE_COMMAND="make lock" $(PY) -m piptools compile -q --generate-hashes --strip-extras \
		--no-emit-find-links --output-file requirements.lock pyproject.toml

# manifests/ rendered from the Helm chart charts/gpupack (the e2e suite fails when they are not current);
# helm is built from its Go module into ~/.cache/gpupack/helm when missing
manifests: $(STAMP)
	$(PY) -m gpupack.harness.manifests

bench: $(STAMP)
	$(VENV)/bin/gpupack bench

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache .cache
