#!/usr/bin/env bash
# readme-example: build the README's "Add it to your project" section as a
# reader would use it, in a crate of its own outside the workspace.
#
#   scripts/readme-example.sh
#
# The README marks each file of that crate with a comment line
# `<!-- readme-example: PATH -->` right before a fenced code block; the
# block becomes PATH (Cargo.toml, src/main.rs) in a temporary directory.
# Cargo.toml gets a [package] header, and its `fleetcoord = ...`
# dependency keeps its version requirement and gains a path to this
# repository, so the build uses this checkout, and fails if the README asks
# for a version the crate does not have. The workspace's Cargo.lock is
# copied in: the dependencies are the versions the workspace is tested
# with, and cargo needs no registry access beyond its cache. The crate is
# then built with warnings as errors, into README_EXAMPLE_TARGET_DIR
# (default: readme-example/ under CARGO_TARGET_DIR or target/), and run as
# the README says it behaves: cli/examples/readme_agent.rs starts it on a
# throwaway etcd, stops etcd for a few seconds, and checks that the agent
# retried, leads and writes again, and exits 0 on SIGTERM.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cargo=${CARGO:-cargo}
readme=$repo/README.md
workspace_target=${CARGO_TARGET_DIR:-$repo/target}
export CARGO_TARGET_DIR=${README_EXAMPLE_TARGET_DIR:-$workspace_target/readme-example}

die() {
  echo "readme-example: $*" >&2
  exit 1
}

crate=$(mktemp -d)
trap 'rm -rf "$crate"' EXIT

# Writes each marked block to its path under $crate; prints the paths.
mkdir -p "$crate/src"
awk -v dir="$crate" '
  /^<!-- readme-example: [^ ]+ -->$/ {
    path = $3; want = 1; next
  }
  want && /^```/ { want = 0; out = dir "/" path; inside = 1; printf "" > out; print path; next }
  inside && /^```/ { inside = 0; close(out); next }
  inside { print > out }
' "$readme" > "$crate/.files"

for f in Cargo.toml src/main.rs; do
  grep -qx "$f" "$crate/.files" \
    || die "README.md marks no $f block (a \`<!-- readme-example: $f -->\` line before a fenced block)"
done
rm "$crate/.files"

# `fleetcoord = "V"` or `fleetcoord = { version = "V", ... }` gains
# `path = "<this repository>"`.
deps=$(cat "$crate/Cargo.toml")
grep -Eq '^fleetcoord = ("|\{)' <<< "$deps" \
  || die "the README's Cargo.toml block has no \`fleetcoord = ...\` line"
deps=$(sed -E \
  -e "s|^fleetcoord = (\"[^\"]*\")|fleetcoord = { version = \1, path = \"$repo\" }|" -e t \
  -e "s|^fleetcoord = \{|fleetcoord = { path = \"$repo\",|" <<< "$deps")
{
  cat <<'EOF'
[package]
name = "readme-example"
version = "0.0.0"
edition = "2021"
publish = false

# Not part of any workspace around the temporary directory.
[workspace]

EOF
  printf '%s\n' "$deps"
} > "$crate/Cargo.toml"
cp "$repo/Cargo.lock" "$crate/Cargo.lock"

echo "== the README's example crate (fleetcoord from $repo):"
sed 's/^/    /' "$crate/Cargo.toml"
cd "$crate"
RUSTFLAGS="${RUSTFLAGS:+$RUSTFLAGS }-D warnings" "$cargo" build
echo "== readme-example: the README's Cargo.toml lines and src/main.rs build"

# The runner builds in the workspace's own target directory, beside the
# rest of the workspace.
agent=$CARGO_TARGET_DIR/debug/readme-example
cd "$repo"
CARGO_TARGET_DIR=$workspace_target "$cargo" run --quiet -p fleetcoord-cli --example readme_agent -- "$agent"
