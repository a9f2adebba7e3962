# `make demo` and `make test` set up everything on a fresh machine (Python, gcc and root).
VENV   := .venv
PYTHON := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# slurm-wlm, munge and libpmix-dev: the tests run campaigns under a one-node Slurm of their own
# (tests/cluster); libpmix-dev gives Slurm's mpi/pmix plugin the library it loads.
DEBIAN_PACKAGES := afl++ gnuplot-nox slurm-wlm munge libpmix-dev
DEMO_OUT := demo-out

# SymCC, built once per machine by tools/build-symcc.sh from SYMCC_SRC (a checkout of SymCC's
# repository with its submodules, or a directory holding symcc-src.tar.gz) into a cache keyed
# by the source's content and the script. The build bakes its destination's absolute path
# into the compiler wrapper, so it cannot be renamed into place: it runs in SYMCC_HOME under
# a lock and counts as done only once the stamp file exists (an interrupted build is redone).
SYMCC_SRC ?= $(abspath ../shared/symcc)
SYMCC_KEY := $(shell tools/build-symcc.sh --key "$(SYMCC_SRC)" 2>/dev/null)
SYMCC_HOME ?= $(HOME)/.cache/symcc-mpi/symcc-$(SYMCC_KEY)
SYMCC_STAMP = $(SYMCC_HOME)/.symcc-mpi-complete
HAVE_SYMCC_SOURCE := $(if $(SYMCC_KEY),1)

.PHONY: setup system-packages symcc examples demo lint test test-fast simulate benchmarks clean

setup: $(STAMP)

system-packages:
	@if ! command -v afl-showmap >/dev/null || ! command -v afl-clang-fast >/dev/null \
	    || ! command -v gnuplot >/dev/null || ! command -v slurmctld >/dev/null \
	    || ! command -v munged >/dev/null || ! dpkg -s libpmix-dev >/dev/null 2>&1; then \
	  echo "installing Debian packages: $(DEBIAN_PACKAGES)"; \
	  $(SUDO) apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q $(DEBIAN_PACKAGES); \
	fi

$(STAMP): pyproject.toml
	$(MAKE) system-packages
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $@

ifeq ($(HAVE_SYMCC_SOURCE),1)
symcc:
	@if [ ! -f "$(SYMCC_STAMP)" ]; then \
	  mkdir -p "$(dir $(SYMCC_HOME))" && \
	  flock "$(SYMCC_HOME).lock" sh -c '\
	    [ -f "$(SYMCC_STAMP)" ] && exit 0; \
	    deps=0; command -v llvm-config-15 >/dev/null || deps=1; \
	    echo "building SymCC from $(SYMCC_SRC) into $(SYMCC_HOME) (a few minutes, once)"; \
	    rm -rf "$(SYMCC_HOME)" && \
	    if [ $$deps = 0 ]; then tools/build-symcc.sh "$(SYMCC_SRC)" "$(SYMCC_HOME)"; \
	    else $(SUDO) env INSTALL_DEPS=1 tools/build-symcc.sh "$(SYMCC_SRC)" "$(SYMCC_HOME)" && \
	      { [ -z "$(SUDO)" ] || $(SUDO) chown -R "$$(id -u):$$(id -g)" "$(SYMCC_HOME)"; }; fi && \
	    touch "$(SYMCC_STAMP)"'; \
	fi
else ifneq ($(origin SYMCC_SRC),file)
symcc:
	@tools/build-symcc.sh --key "$(SYMCC_SRC)" >/dev/null
else
symcc:
	@echo "symcc: no SymCC source in $(SYMCC_SRC) (a SymCC checkout, or symcc-src.tar.gz): real-SymCC tests will be skipped; make symcc SYMCC_SRC=DIR builds one"
endif

examples: setup symcc
	$(MAKE) -C examples $(if $(HAVE_SYMCC_SOURCE),SYMCC=$(SYMCC_HOME)/bin/symcc)

demo: setup
	$(MAKE) -C examples
	rm -rf $(DEMO_OUT)
	$(VENV)/bin/symcc-mpi explore --target "examples/build/tlv @@" \
	    --afl-target "examples/build/tlv.afl @@" --seeds examples/seeds/tlv \
	    --out $(DEMO_OUT) --workers 2 --timeout 10 --wall-timeout 60
	$(VENV)/bin/symcc-mpi verify $(DEMO_OUT)

# ruff, and the layers of docs/architecture.md as import-linter contracts (pyproject.toml).
lint: setup
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/lint-imports --no-cache

# pytest exits 5 when it collected nothing: that is a failure here, not a pass. -rs prints
# why each skipped test was skipped.
pytest = $(if $(HAVE_SYMCC_SOURCE),SYMCC_MPI_REQUIRE_SYMCC=1) $(PYTHON) -m pytest -q -rs \
	-p no:cacheprovider --durations=20 $(1); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make $@: pytest collected no tests" >&2; exit 1; fi; \
	exit $$rc

# Every test, in two runs: first what must have the machine to itself (`alone`: the thousand
# simulated schedules, which use both cores), then the rest on three pytest workers: much of
# the rest waits on real ranks and deadlines (one at a time about 1,910 s; on two workers
# 1,430-1,493 s, on three 1,281-1,447 s at 121-144% CPU, 2026-12-07).
test: lint examples
	$(call pytest,-m alone tests)
	$(call pytest,-n 3 --dist loadgroup -m "not alone" tests)

# The tiers a developer runs between changes (about 2 minutes): every test but the ones that
# start mpiexec (`mpi`) or take long (`slow`, e.g. the thousand simulated schedules).
test-fast: lint examples
	$(call pytest,-m "not mpi and not slow" tests)

# The deterministic simulation (tests/simulation): SEEDS schedules of the real session code
# under faults, every invariant checked after every turn. SEED=N replays one, with its log.
SEEDS ?= 1000
simulate: setup
	cd tests && ../$(PYTHON) -m simulation $(if $(SEED),--seed $(SEED) --verbose,--seeds $(SEEDS))

clean:
	rm -rf $(DEMO_OUT) examples/build .pytest_cache
