#!/usr/bin/env bash
# Regenerates docs/report-screenshot.png, the picture in the README's "Report on a run", the
# way that section's chaos run does it: a coordinator with the default settings (a fresh data dir, free
# ports), 10 workers for 60 s under chaos recorded by docs/simulate-and-record.sh, the
# capacity report, and headless Chromium's screenshot of its page from the top through the
# four charts, scaled to the width a README shows.
#
# Usage: docs/make-screenshot.sh [WORK_DIR]
#
# WORK_DIR (default: a new directory under /tmp) keeps the run, the report and the full-size
# screenshot. Needs the project installed (make install) and Chromium (Debian package
# `chromium`; CHROMIUM names another binary). Takes about two minutes.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
bin=$root/.venv/bin
work=${1:-$(mktemp -d /tmp/report-screenshot.XXXXXX)}
chromium=${CHROMIUM:-chromium}
mkdir -p "$work"
work=$(cd "$work" && pwd)
export no_proxy=127.0.0.1,localhost NO_PROXY=127.0.0.1,localhost

read -r kafka_port admin_port < <("$bin/python" -c '
import socket
sockets = [socket.socket() for _ in range(2)]
for s in sockets:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in sockets))')
admin=http://127.0.0.1:$admin_port

# 1. The coordinator, as `make run` starts it (only the ports and the data dir differ).
"$bin/connect-coordinator" serve --listen "127.0.0.1:$kafka_port" \
  --admin-listen "127.0.0.1:$admin_port" --data-dir "$work/data" --log-format json \
  2> "$work/serve.log" &
coordinator=$!
stop_coordinator() {
  if kill -0 "$coordinator" 2>/dev/null; then
    kill -TERM "$coordinator"
    wait "$coordinator" || true
  fi
}
trap stop_coordinator EXIT
"$bin/python" - "$admin/readyz" <<'EOF'
import sys, time, urllib.request
deadline = time.monotonic() + 30
while True:
    try:
        with urllib.request.urlopen(sys.argv[1], timeout=2):
            break
    except OSError:
        if time.monotonic() > deadline:
            sys.exit(f"the coordinator is not ready at {sys.argv[1]}")
        time.sleep(0.1)
EOF

# 2. The simulator under chaos, recorded: the README's second command, with the ports.
# Run from WORK_DIR with the README's relative paths, which the report's page shows.
cd "$work"
ADMIN_URL=$admin CONNECT_COORDINATOR=$bin/connect-coordinator DATA_DIR=$work/data \
  "$root/docs/simulate-and-record.sh" chaos --group chaos --workers 10 --connectors 4 \
  --tasks-per-connector 5 --duration 60 --chaos kill,bounce,pause \
  --rebalance-delay-ms 5000 --bootstrap "127.0.0.1:$kafka_port"
stop_coordinator

# 3. The report: the README's third command.
"$bin/connect-coordinator" report --metrics chaos/metrics --snapshot chaos/snapshot.parquet \
  --simulation chaos/simulation.json --group chaos --out chaos/report

# The page in headless Chromium. Without the background-networking flags it waits on the
# network on an offline host; the timeout stops it if it hangs anyway.
profile=$(mktemp -d)
timeout 120 "$chromium" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --no-proxy-server --hide-scrollbars --user-data-dir="$profile" \
  --screenshot="$work/page.png" --window-size=1280,3200 "file://$work/chaos/report/index.html" \
  2> "$work/chromium.log"
rm -rf "$profile"

# From the top through the last chart (the tables after it are in the CSVs), at the width
# of the page's text column, scaled to 880 px wide and stored with a 256-colour palette.
"$bin/python" - "$work/page.png" "$root/docs/report-screenshot.png" <<'EOF'
import sys

import numpy as np
from PIL import Image

page = Image.open(sys.argv[1]).convert("RGB")
pixels = np.asarray(page)
ink = np.any(pixels < 250, axis=-1)
right = int(np.nonzero(ink.any(axis=0))[0].max()) + 24
# The charts are the only images, each framed by a 1 px #ddd border (tables use #ccc): the
# last long line of that grey is the bottom of the last chart.
frame = np.all(np.abs(pixels.astype(int) - 0xDD) <= 2, axis=-1).sum(axis=1) > 300
rows = np.nonzero(frame)[0]
bottom = int(rows.max()) + 16 if len(rows) else page.height
shot = page.crop((0, 0, min(right, page.width), min(bottom, page.height)))
scale = 880 / shot.width
shot = shot.resize((880, round(shot.height * scale)), Image.LANCZOS)
shot.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(sys.argv[2], optimize=True)
print(f"{sys.argv[2]}: {shot.width}x{shot.height}")
EOF
ls -l "$root/docs/report-screenshot.png"
echo "run, report and full screenshot in $work"
