#!/usr/bin/env bash
# A fresh server's first writes, with and without the workers' warm-up (api/warm_up.py).
#
#   loadtest/studies/cold_start.sh [ROUNDS]
#
# Each run starts a server with production defaults (authorization and the
# access log on, WORKERS workers, default 2) and a private Redis, warms it
# up as ../shared/peers/bench.sh does (WARM seconds of GETs, default 6, on a
# ~200 B document, a ~10 KB one, /healthz and the URL the PUTs will write:
# no PUT), then measures DUR seconds (default 10) of PUTs of the ~200 B
# document, 64 connections, and after them DUR seconds of its reads. The runs
# alternate JETWAY_WARM_UP=0 and the default (off on, on off, ...), so each
# takes each place in turn on this shared machine. The table, with each
# run's p99 and req/s, goes to loadtest/results/cold_start.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${1:-2}
WORKERS=${WORKERS:-2}
WARM=${WARM:-6}
DUR=${DUR:-10}
OUT=loadtest/results/cold_start.md
WORK=$(mktemp -d)
SERVER=""
REDIS_PID=""
cleanup() {
  [ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null && wait "$SERVER" 2>/dev/null
  [ -n "$REDIS_PID" ] && kill "$REDIS_PID" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT

printf '%s' '{"id":"p1","name":"widget","price":12.5,"tags":["red","small"],"stock":{"where":"north","qty":42},"updated":"2026-01-01T00:00:00Z","active":true}' > "$WORK/small.json"
python3 -c 'import json; print(json.dumps({"id": "p2", "items": [{"sku": f"SKU-{n:05d}", "qty": n, "price": n * 1.25, "url": f"https://example.com/{n}"} for n in range(120)]}))' > "$WORK/large.json"

summary() {  # summary FILE: "p50_ms p99_ms req/s" from wrk.lua's BENCH line
  python3 -c 'import json, sys
line = [l for l in open(sys.argv[1]) if l.startswith("BENCH ")][0]
b = json.loads(line[6:])
print("%.2f %.2f %.0f" % (b["p50_us"] / 1000, b["p99_us"] / 1000, b["requests"] * 1e6 / b["duration_us"]))' "$1"
}

run() {  # run WARM_UP: one fresh server, its warm-up by GETs, then the PUTs and the reads
  local warm_up=$1 port token url
  redis-server --port 0 --unixsocket "$WORK/r.sock" --save '' --daemonize no --logfile "$WORK/r.log" &
  REDIS_PID=$!
  sleep 0.3
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  token=$(REDIS_URL="unix://$WORK/r.sock" .venv/bin/python -m api keys create --name cold --scope admin 2>/dev/null)
  env REDIS_URL="unix://$WORK/r.sock" JETWAY_WARM_UP="$warm_up" .venv/bin/python -m api serve --port "$port" \
    --workers "$WORKERS" > "$WORK/server-$warm_up.log" 2>&1 &
  SERVER=$!
  for _ in $(seq 150); do curl -sf "localhost:$port/healthz" > /dev/null && break; sleep 0.2; done
  url=http://127.0.0.1:$port
  for doc in small large; do
    curl -s -o /dev/null -X PUT -H "Authorization: Bearer $token" -H 'Content-Type: application/json' \
      --data-binary "@$WORK/$doc.json" "$url/v1/cold/$doc"
  done
  for path in /v1/cold/small /v1/cold/large /healthz /v1/cold/p1; do
    wrk -t1 -c64 -d"${WARM}s" -H "Authorization: Bearer $token" "$url$path" > /dev/null
  done
  BENCH_METHOD=PUT BENCH_BODY_FILE="$WORK/small.json" wrk -t1 -c64 -d"${DUR}s" -s loadtest/bench/wrk.lua \
    -H "Authorization: Bearer $token" "$url/v1/cold/p1" > "$WORK/put.txt"
  wrk -t1 -c64 -d"${DUR}s" -s loadtest/bench/wrk.lua -H "Authorization: Bearer $token" "$url/v1/cold/small" > "$WORK/get.txt"
  echo "| $warm_up | $(summary "$WORK/put.txt" | awk '{printf "%s | %s | %s", $1, $2, $3}') | $(summary "$WORK/get.txt" | awk '{printf "%s | %s", $2, $3}') | $(grep -o 'warm-up:\? [0-9]* requests in [0-9.]* s' "$WORK/server-$warm_up.log" | awk '{print $5}' | paste -sd/ -) |"
  kill "$SERVER"; wait "$SERVER" 2>/dev/null || true; SERVER=""
  kill "$REDIS_PID"; wait "$REDIS_PID" 2>/dev/null || true; REDIS_PID=""
  rm -f "$WORK/r.sock"
}

default=$(.venv/bin/python -c 'from api.config import Settings; print(Settings().warm_up)')
{
  echo "# A fresh server's first writes: JETWAY_WARM_UP=0 against $default"
  echo
  echo "\`loadtest/studies/cold_start.sh $ROUNDS\` at $(git rev-parse --short HEAD), $(date -u '+%Y-%m-%d %H:%M UTC'); $WORKERS workers, production defaults,"
  echo "${WARM} s of GETs per URL first (no PUT), then ${DUR} s of PUTs of ~200 B, then ${DUR} s of its reads (64 connections)."
  echo
  echo "| JETWAY_WARM_UP | PUT p50 ms | PUT p99 ms | PUT req/s | read p99 ms | read req/s | warm-up s (each worker) |"
  echo "| ---: | ---: | ---: | ---: | ---: | ---: | --- |"
  for round in $(seq "$ROUNDS"); do
    if [ $((round % 2)) = 1 ]; then run 0; run "$default"; else run "$default"; run 0; fi
  done
} | tee "$OUT"
