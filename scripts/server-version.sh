# shellcheck shell=bash
# Sourced by matrix-servers.sh and test-matrix.sh (not run on its own).
#
#   server_version etcd|nats|redis BIN
#
# prints the version BIN reports, as plain x.y.z (nothing if it reports a
# format this does not know); fails, saying why on stderr, when BIN
# --version fails.
server_version() {
  local out
  if ! out=$("$2" --version 2>&1); then
    echo "$2 --version failed: $out" >&2
    return 1
  fi
  case "$1" in
    etcd) sed -n 's/^etcd Version: \([0-9.]*\).*/\1/p' <<<"$out" ;;
    nats) sed -n 's/^nats-server: v\([0-9.]*\).*/\1/p' <<<"$out" ;;
    redis) sed -n 's/^Redis server v=\([0-9.]*\) .*/\1/p' <<<"$out" ;;
  esac
}
