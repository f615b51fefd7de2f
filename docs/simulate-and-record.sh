#!/usr/bin/env bash
# The chaos simulator against a running coordinator, recording what `connect-coordinator
# report` reads:
#
#   OUT/metrics/           the coordinator's /metrics, scraped while the run lasts
#   OUT/simulation.json    the simulator's own report (violations, disruptions, convergence)
#   OUT/snapshot.parquet   the record log's groups, workers and units just after the run
#
# Usage: docs/simulate-and-record.sh OUT [simulate options ...]
#
# Environment: ADMIN_URL (the coordinator's admin listener, default http://127.0.0.1:19093),
# DATA_DIR (its --data-dir, default ./data), SCRAPE_INTERVAL (seconds between scrapes,
# default 3: the default heartbeat interval, so each scrape sees one round of heartbeats),
# CONNECT_COORDINATOR (the command, default .venv/bin/connect-coordinator of this checkout).
# The simulate options go to `simulate` as they are (--bootstrap defaults to
# 127.0.0.1:19092).
#
# The workers are static members (`simulate --static`): a static member that leaves is kept
# with its assignment for the session timeout (group.connect.session.timeout.ms, 10 s by
# default), so a snapshot taken as the run ends still has every worker and its tasks. The
# exit status is the simulator's (0: no unit ran twice and the group converged each time).
set -euo pipefail

if [ $# -lt 1 ] || [ "${1#-}" != "$1" ]; then
  echo "usage: $0 OUT [simulate options ...]" >&2
  exit 2
fi
out=$1
shift
root=$(cd "$(dirname "$0")/.." && pwd)
cc=${CONNECT_COORDINATOR:-$root/.venv/bin/connect-coordinator}
admin=${ADMIN_URL:-http://127.0.0.1:19093}
data_dir=${DATA_DIR:-./data}
interval=${SCRAPE_INTERVAL:-3}

if [ -n "$(ls -A "$out/metrics" 2>/dev/null)" ]; then
  echo "$0: $out/metrics is not empty; the report would mix two runs (pick a new OUT)" >&2
  exit 2
fi
mkdir -p "$out/metrics"

# SIGINT tells the recorder to write what it has and stop. Job control starts it in its own
# process group, where a script's background job does not ignore SIGINT. (A shell started
# with SIGINT ignored passes that on regardless; then SIGTERM stops it, losing at most the
# samples since its last write, --flush-every.)
set -m
"$cc" metrics record --url "$admin/metrics" --interval "$interval" --duration 86400 \
  --flush-every 10 --out "$out/metrics" &
recorder=$!
set +m
stop_recorder() {
  kill -INT "$recorder" 2>/dev/null || return 0
  for _ in $(seq 50); do
    kill -0 "$recorder" 2>/dev/null || break
    sleep 0.1
  done
  if kill -TERM "$recorder" 2>/dev/null; then
    echo "$0: the recorder ignored SIGINT; stopped it with SIGTERM" >&2
  fi
  wait "$recorder" 2>/dev/null || true
}
trap stop_recorder EXIT
trap 'exit 130' INT TERM
sleep 1.5  # a first scrape before the workers start: the counters' starting values

status=0
"$cc" simulate --admin "$admin" --static --report "$out/simulation.json" "$@" || status=$?
# Right away, while the coordinator still holds the workers that just left.
"$cc" log snapshot --data-dir "$data_dir" --out "$out/snapshot.parquet"
sleep "$interval"  # a last scrape after the workers left
stop_recorder
exit "$status"
