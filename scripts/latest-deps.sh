#!/usr/bin/env bash
# latest-deps: build and test the workspace against the newest versions of
# its dependencies that its Cargo.toml files allow, as a user who adds
# fleetcoord to a project without our Cargo.lock gets them. A dependency's
# new deprecation or a changed API shows here before a user meets it.
#
#   scripts/latest-deps.sh
#
# The working tree (tracked and untracked files git does not ignore) is
# copied into a temporary directory without Cargo.lock; `cargo update`
# resolves every dependency afresh there, and the versions that differ
# from the committed lock file are printed. Then, with warnings as errors
# for the workspace's own code (dependencies' lints are capped by cargo):
#   cargo build --workspace --all-targets --all-features
#   cargo test -p fleetcoord-sm -p fleetcoord-test-support
#       the machines' unit tests, simulation, model check (quick set), doc tests
#   cargo test -p fleetcoord --all-features --lib
#       the library's unit tests (some start etcd and redis-server)
# The repository itself is never changed. Build output goes to
# LATEST_DEPS_TARGET_DIR (default: latest-deps/ under CARGO_TARGET_DIR or
# target/), so the locked build's artifacts stay where they are.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cargo=${CARGO:-cargo}
export CARGO_TARGET_DIR=${LATEST_DEPS_TARGET_DIR:-${CARGO_TARGET_DIR:-$repo/target}/latest-deps}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Files deleted in the working tree but still in the index are skipped:
# the copy is of what is there.
(cd "$repo" && git ls-files -z --cached --others --exclude-standard) \
  | (cd "$repo" && while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done) \
  | (cd "$repo" && tar --null -T - -cf -) \
  | tar -xf - -C "$work"
rm -f "$work/Cargo.lock"
cd "$work"

echo "== cargo update (a fresh resolve, no lock file)"
"$cargo" update

# "name versions" of every package in a lock file (versions comma-joined:
# a package can be there in several), one a line, sorted by name.
lock_versions() {
  awk '/^name = /{gsub(/"/, "", $3); n = $3} /^version = /{gsub(/"/, "", $3); if (n in v) v[n] = v[n] "," $3; else v[n] = $3}
       END {for (n in v) print n, v[n]}' "$1" | LC_ALL=C sort
}
echo "== packages whose versions differ from the committed Cargo.lock (locked -> fresh)"
LC_ALL=C join -a1 -a2 -e - -o 0,1.2,2.2 <(lock_versions "$repo/Cargo.lock") <(lock_versions Cargo.lock) \
  | awk '$2 != $3 {print "  " $1 " " $2 " -> " $3; n++} END {if (!n) print "  (none)"}'

export RUSTFLAGS="${RUSTFLAGS:+$RUSTFLAGS }-D warnings"
echo "== cargo build --workspace --all-targets --all-features (RUSTFLAGS=$RUSTFLAGS)"
"$cargo" build --workspace --all-targets --all-features
echo "== cargo test -p fleetcoord-sm -p fleetcoord-test-support"
"$cargo" test -p fleetcoord-sm -p fleetcoord-test-support
echo "== cargo test -p fleetcoord --all-features --lib"
"$cargo" test -p fleetcoord --all-features --lib
echo "== latest-deps: built with 0 warnings and tested against the fresh resolve"
