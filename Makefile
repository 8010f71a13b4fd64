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
	$(CARGO) build --quiet -p fleetcoord-cli --bin fleetcoord --example demo
	$(CARGO) run --quiet -p fleetcoord-cli --example demo $(if $(ENDPOINTS),-- --endpoints $(ENDPOINTS))

deps: deps-build deps-etcd deps-fuzz deps-rust

# apt_install(what package ...): installs the Debian package of every `what`
# that is missing. A `what` starting with `/` is a file the build reads (a
# header, a .proto), anything else a command on PATH: checking only for a
# binary is how `libprotobuf-dev` went missing once (protoc was there, the
# well-known .proto files it needs were not). apt-get update first; sudo when
# not root; a clear failure where apt-get or sudo is unavailable.
define apt_install
	@missing=""; \
	set -- $(1); \
	while [ $$# -gt 0 ]; do \
	  case "$$1" in \
	    /*) [ -e "$$1" ] || missing="$$missing $$2" ;; \
	    *) command -v "$$1" >/dev/null 2>&1 || missing="$$missing $$2" ;; \
	  esac; \
	  shift 2; \
	done; \
	if [ -n "$$missing" ]; then \
	  if ! command -v apt-get >/dev/null 2>&1; then \
	    echo "make: missing packages:$$missing. apt-get is not available here;" \
	      "install their equivalents with your package manager and run make again" >&2; \
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

# etcd-client's build script runs protoc on etcd's .proto files, which import
# protobuf's well-known types (google/protobuf/descriptor.proto ...).
deps-build:
	$(call apt_install,protoc protobuf-compiler /usr/include/google/protobuf/descriptor.proto libprotobuf-dev cc gcc)

deps-etcd:
	$(call apt_install,etcd etcd-server etcdctl etcd-client)

# libfuzzer-sys compiles libFuzzer (C++) with the host's C and C++ compilers.
deps-fuzz: deps-rust
	$(call apt_install,cc gcc c++ g++)
	@command -v cargo-fuzz >/dev/null 2>&1 || $(CARGO) install --locked cargo-fuzz

# rustfmt and clippy are not in rustup's minimal profile.
deps-rust:
	@if command -v rustup >/dev/null 2>&1; then \
	  $(CARGO) fmt --version >/dev/null 2>&1 || rustup component add rustfmt; \
	  $(CARGO) clippy --version >/dev/null 2>&1 || rustup component add clippy; \
	fi
