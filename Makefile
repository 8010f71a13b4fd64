# fleetcoord: build, test and fuzz entry points. `make test` is what CI runs.
#
#   make test   install what is missing, then fmt check, every test against
#               real etcd, and a replay of the committed fuzz corpora
#   make fuzz   run each fuzz target for FUZZ_SECONDS (default 60)
#   make lint   clippy with -D warnings for the workspace and the fuzz crate

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c

CARGO ?= cargo
FUZZ_TARGETS := keepalive watch election
FUZZ_SECONDS ?= 60
# cargo-fuzz needs nightly flags; this lets the stable toolchain accept them.
FUZZ_ENV := RUSTC_BOOTSTRAP=1

.PHONY: test fuzz lint demo deps deps-build deps-etcd deps-fuzz deps-rust

test: deps
	$(CARGO) fmt --all --check
	cd fuzz && $(CARGO) fmt --check
	$(CARGO) test --workspace --all-features
	cd fuzz && for t in $(FUZZ_TARGETS); do \
	  if [ ! -d "corpus/$$t" ]; then \
	    echo "make: fuzz/corpus/$$t is missing; every fuzz target needs a committed seed corpus" >&2; \
	    exit 1; \
	  fi; \
	  echo "== replaying fuzz/corpus/$$t"; \
	  $(FUZZ_ENV) $(CARGO) fuzz run "$$t" "corpus/$$t" -- -runs=0; \
	done

# New inputs go to fuzz/target/corpus/<t> (ignored by git); the committed
# corpus/<t> is only read, so a fuzz run never dirties the tree.
fuzz: deps-fuzz
	cd fuzz && for t in $(FUZZ_TARGETS); do \
	  mkdir -p "target/corpus/$$t"; \
	  seeds=""; [ -d "corpus/$$t" ] && seeds="corpus/$$t"; \
	  echo "== fuzzing $$t for $(FUZZ_SECONDS) s"; \
	  $(FUZZ_ENV) $(CARGO) fuzz run "$$t" "target/corpus/$$t" $$seeds -- -max_total_time=$(FUZZ_SECONDS); \
	done

lint: deps-build deps-rust
	$(CARGO) clippy --workspace --all-targets --all-features -- -D warnings
	cd fuzz && $(CARGO) clippy --all-targets -- -D warnings

# A narrated fleet (three agents, two campaigners) on a throwaway local etcd;
# `make demo ENDPOINTS=host:port` runs it against an existing etcd instead.
# The demo spawns the `fleetcoord` binary, so both are built first.
demo: deps-build deps-etcd
	$(CARGO) build --quiet --features testing --bin fleetcoord --example demo
	$(CARGO) run --quiet --features testing --example demo $(if $(ENDPOINTS),-- --endpoints $(ENDPOINTS))

deps: deps-build deps-etcd deps-fuzz deps-rust

# apt_install(binary package ...): installs the Debian packages whose binaries
# are missing. apt-get update first; sudo when not root; a clear failure where
# apt-get is unavailable.
define apt_install
	@missing=""; \
	set -- $(1); \
	while [ $$# -gt 0 ]; do \
	  command -v "$$1" >/dev/null 2>&1 || missing="$$missing $$2"; \
	  shift 2; \
	done; \
	if [ -n "$$missing" ]; then \
	  if ! command -v apt-get >/dev/null 2>&1; then \
	    echo "make: missing packages:$$missing. apt-get is not available here;" \
	      "install them with your package manager (etcd provides etcd and etcdctl," \
	      "protobuf provides protoc) and run make again" >&2; \
	    exit 1; \
	  fi; \
	  sudo=""; \
	  if [ "$$(id -u)" != 0 ]; then \
	    if command -v sudo >/dev/null 2>&1; then sudo=sudo; else \
	      echo "make: need root or sudo to apt-get install$$missing" >&2; exit 1; \
	    fi; \
	  fi; \
	  echo "== installing$$missing"; \
	  $$sudo apt-get update; \
	  $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends$$missing; \
	fi
endef

deps-build:
	$(call apt_install,protoc protobuf-compiler)

deps-etcd:
	$(call apt_install,etcd etcd-server etcdctl etcd-client)

deps-fuzz: deps-rust
	@command -v cargo-fuzz >/dev/null 2>&1 || $(CARGO) install --locked cargo-fuzz

# rustfmt and clippy are not in rustup's minimal profile.
deps-rust:
	@if command -v rustup >/dev/null 2>&1; then \
	  $(CARGO) fmt --version >/dev/null 2>&1 || rustup component add rustfmt; \
	  $(CARGO) clippy --version >/dev/null 2>&1 || rustup component add clippy; \
	fi
