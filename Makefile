# `make demo` and `make test` set up everything on a fresh machine (Python, gcc and root).
VENV   := .venv
PYTHON := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
DEBIAN_PACKAGES := afl++ gnuplot-nox
DEMO_OUT := demo-out

.PHONY: setup system-packages examples demo test benchmarks clean

setup: $(STAMP)

system-packages:
	@if ! command -v afl-showmap >/dev/null || ! command -v afl-clang-fast >/dev/null \
	    || ! command -v gnuplot >/dev/null; then \
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

examples: setup
	$(MAKE) -C examples

demo: examples
	rm -rf $(DEMO_OUT)
	$(VENV)/bin/symcc-mpi explore --target "examples/build/tlv @@" \
	    --afl-target "examples/build/tlv.afl @@" --seeds examples/seeds/tlv \
	    --out $(DEMO_OUT) --workers 2 --timeout 10 --wall-timeout 300
	$(VENV)/bin/symcc-mpi verify $(DEMO_OUT)

# pytest exits 5 when it collected nothing: that is a failure here, not a pass.
test: examples
	$(PYTHON) -m pytest -q -p no:cacheprovider tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; \
	exit $$rc

clean:
	rm -rf $(DEMO_OUT) examples/build .pytest_cache
