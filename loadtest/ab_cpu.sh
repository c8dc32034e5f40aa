#!/usr/bin/env bash
# A/B of two revisions on the hot read path: worker CPU time per request.
#
#   loadtest/ab_cpu.sh REV_A REV_B [ROUNDS]
#
# Each revision is checked out in a temporary worktree (sharing .venv) and
# served by one PyPy worker with its own private Redis; wrk reads a ~200 B
# document with 64 connections (10 s warm-up, then 5 s runs). The runs are
# interleaved A, B, B, A, A, B, ... and the server's user+system CPU time per
# request (its workers' and its master's, which passes the workers' log
# lines on) is read from /proc: on a shared, noisy machine it moves far less
# than requests per second, which are printed too, with the worker's
# resident memory at the end. The server's output goes to a file.
#
# Env: AUTH_A / AUTH_B=on (authorization on, with a token; default off) or
# jwt (authorization on, and the load's token a JWT of a local issuer served
# for the run by loadtest/_jwt_issuer.py: RS256, sub bench-user, scope
# "read:bench write:bench"), RULE_A / RULE_B=owner (the owner rule
# {"owner":{"pointer":"/owner"}} put on the collection before its documents
# are written; with either set, both sides' documents carry
# "owner":"bench-user", so the JWT's user owns them; with CASE=put the
# rule's pinned writes race and most PUTs are 412s), ENV_A / ENV_B
# ("NAME=value ..." more environment for that server, e.g.
# PYPY_GC_NURSERY=16MB or JETWAY_ACCESS_LOG=on; the access log is off
# otherwise), HEADER_A / HEADER_B (one more request header for that side's
# load, e.g. "Origin: https://app.example" with
# ENV_*=JETWAY_CORS_ORIGINS=...), DUR, WARM, and CASE: get (the ~200 B read,
# default), get10k (a ~10 KB read), put (a ~200 B PUT, repeated on one
# document), miss (~200 B reads of MISS_DOCS documents, default 200,000, in
# turn, the measured run from the middle: more than the hot cache holds, read
# again and again; with MISS_DOCS=2000000, more than the warm-up and the run
# read, so that every measured read is its document's first) or putmany
# (~200 B PUTs over MISS_DOCS ids in turn), and WORKERS (default 1; with
# more, the resident memory is the largest worker's), and PIN=1: the server
# (master and workers) on the second core and wrk and Redis on the first
# (taskset), so that the scheduler's placing of them moves the figures less.
# TOGETHER=1: A's and B's servers run at the same time, each under its own wrk
# of 32 connections, warmed and measured side by side; the machine's drift
# over a run (a third here) then moves both sides alike, and the per-round
# ratio of their figures is what to compare.
# Each line also gives the workers' CPU per request on their reactor's
# thread (main_us_per_request) and on all their other threads (the trace
# exporter's, the log writer's: threads_us_per_request).
set -euo pipefail
cd "$(dirname "$0")/.."
A=${1:?revision A}; B=${2:?revision B}; ROUNDS=${3:-3}
CASE=${CASE:-get}
WORKERS=${WORKERS:-1}
case $CASE in get | get10k | put | miss | putmany) ;; *) echo "CASE must be get, get10k, put, miss or putmany" >&2; exit 2 ;; esac
ON_FIRST="" ON_SECOND=""
CONNECTIONS=64
[ "${TOGETHER:-}" = 1 ] && CONNECTIONS=32  # each side's wrk: the machine holds as many connections as alone
[ "${PIN:-}" = 1 ] && ON_FIRST="taskset -c 0" ON_SECOND="taskset -c 1"
WORK=$(mktemp -d)
cleanup() {
  # Servers a failed run left: the master (its workers follow it) and Redis.
  for pidfile in "$WORK"/*/server.pid "$WORK"/*/r.pid "$WORK"/issuer.pid; do
    [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
  done
  for rev in a b; do git worktree remove --force "$WORK/$rev" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT
for rev in a b; do
  ref=$([ $rev = a ] && echo "$A" || echo "$B")
  git worktree add -q --detach "$WORK/$rev" "$ref"
  ln -s "$PWD/.venv" "$WORK/$rev/.venv"
done

OWNER=""  # the member every document carries when a side has the owner rule
[ -n "${RULE_A:-}${RULE_B:-}" ] && OWNER='"owner":"bench-user",'
if [ "${AUTH_A:-}" = jwt ] || [ "${AUTH_B:-}" = jwt ]; then  # the local issuer, for the whole run
  .venv/bin/python loadtest/_jwt_issuer.py serve "$WORK/issuer" > "$WORK/issuer.log" 2>&1 &
  echo $! > "$WORK/issuer.pid"
  for _ in $(seq 100); do [ -f "$WORK/issuer/issuers.json" ] && break; sleep 0.2; done
  JWT=$(.venv/bin/python loadtest/_jwt_issuer.py mint "$WORK/issuer")
fi

stat_ticks() {  # stat_ticks FILE...: the user+system time the /proc stat files give, summed, in clock ticks
  awk '{t+=$14+$15} END {print t}' "$@"
}

cpu_ticks() {  # cpu_ticks PID...: their user+system time, in clock ticks
  local w files=()
  for w in "$@"; do files+=("/proc/$w/stat"); done
  stat_ticks "${files[@]}"
}

main_ticks() {  # main_ticks PID...: the user+system time of each one's main thread alone, in clock ticks
  local w files=()
  for w in "$@"; do files+=("/proc/$w/task/$w/stat"); done
  stat_ticks "${files[@]}"
}

cache_counts() {  # cache_counts PORT: the hot caches' invalidations, hits and evictions so far, all workers (0s without)
  sleep 1.1  # every worker's metrics written (once a second)
  curl -s "localhost:$1/metrics" | awk '/^jetway_hot_cache_invalidations_total/ {i=$2}
    /^jetway_hot_cache_hits_total/ {h=$2} /^jetway_hot_cache_evictions_total/ {e=$2} END {print i+0, h+0, e+0}'
}

start_side() {  # start_side DIR TREE LABEL AUTH EXTRA_ENV EXTRA_HEADER RULE: one server and its Redis, documents written
  local dir=$1 tree=$2 label=$3 auth=$4 extra=$5 more=$6 rule=$7 port pid workers header="" token
  local issuers="" admin=""
  $ON_FIRST redis-server --port 0 --unixsocket "$dir/r.sock" --save '' --daemonize yes --pidfile "$dir/r.pid" --logfile "$dir/r.log"
  sleep 0.3
  port=$((20000 + RANDOM % 10000))
  [ "$auth" = jwt ] && issuers="JETWAY_OIDC_ISSUERS=$WORK/issuer/issuers.json"
  # shellcheck disable=SC2086 # EXTRA_ENV is a list of NAME=value words
  (cd "$tree" && exec env REDIS_URL="unix://$dir/r.sock" JETWAY_ACCESS_LOG=off JETWAY_AUTH="${auth/jwt/on}" $issuers $extra \
    $ON_SECOND .venv/bin/python -m api serve --port $port --workers "$WORKERS" > "$dir/server.log" 2>&1) &
  pid=$!
  echo "$pid" > "$dir/server.pid"
  workers=""
  for _ in $(seq 100); do  # the master's workers, once they are serving
    workers=$(cat "/proc/$pid/task/$pid/children" 2>/dev/null || true)
    [ "$(echo "$workers" | wc -w)" = "$WORKERS" ] && curl -sf "localhost:$port/healthz" > /dev/null && break
    workers=""
    sleep 0.2
  done
  [ -n "$workers" ] || { echo "$label: the server did not start" >&2; cat "$dir/server.log" >&2; exit 1; }
  if [ "$auth" != off ]; then  # the settings and documents are written with Jetway's own admin token
    token=$(cd "$tree" && REDIS_URL="unix://$dir/r.sock" .venv/bin/python -m api keys create --name ab --scope admin 2>/dev/null)
    admin="Authorization: Bearer $token"
    header=$([ "$auth" = jwt ] && echo "Authorization: Bearer $JWT" || echo "$admin")
  fi
  if [ "$rule" = owner ]; then
    curl -sf -X PUT -H "$admin" -H 'Content-Type: application/json' --data-binary '{"owner":{"pointer":"/owner"}}' \
      "localhost:$port/v1/_collections/bench" > /dev/null
    sleep 0.5  # every worker's settings cache hears of it
  fi
  printf '%s' '{"id":"small",'"$OWNER"'"name":"Ada Lovelace","email":"ada@example.com","tags":["math","engines"],"score":97.5,"active":true,"address":{"city":"London","zip":"W1"}}' > "$dir/small.json"
  printf '{"id":"large",%s"text":"%s"}' "$OWNER" "$(head -c 10240 /dev/zero | tr '\0' a)" > "$dir/large.json"
  for doc in small large; do
    curl -s -X PUT -H "$admin" -H 'Content-Type: application/json' --data-binary "@$dir/$doc.json" \
      "localhost:$port/v1/bench/$doc" > /dev/null
  done
  if [ "$auth" = jwt ]; then  # the workers fetch the issuer's keys at start: 503 until they have them
    for _ in $(seq 50); do
      [ "$(curl -s -o /dev/null -w '%{http_code}' -H "$header" "localhost:$port/v1/bench/small")" = 200 ] && break
      sleep 0.2
    done
    curl -sf -o /dev/null -H "$header" "localhost:$port/v1/bench/small" ||
      { echo "$label: the JWT is not accepted" >&2; cat "$dir/server.log" >&2; exit 1; }
  fi
  local target=small method=GET ids=0
  [ "$CASE" = get10k ] && target=large
  [ "$CASE" = put ] && method=PUT
  [ "$CASE" = putmany ] && method=PUT && ids=${MISS_DOCS:-200000}
  if [ "$CASE" = miss ]; then  # the documents straight into Redis, laid out as the store does (cache/keys.py)
    ids=${MISS_DOCS:-200000}
    python3 -c 'import sys, zlib
body = open(sys.argv[2], "rb").read()
out = sys.stdout.buffer
for n in range(int(sys.argv[1])):
    i = b"m%d" % n
    key = b"jw:{bench:%02x}:d:" % (zlib.crc32(i) % 16) + i
    args = [b"HSET", key, b"b", body, b"e", b"\"e%d\"" % n, b"m", b"Mon, 23 Nov 2026 10:00:00 GMT"]
    out.write(b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args))' \
      "$ids" "$dir/small.json" | redis-cli -s "$dir/r.sock" --pipe > /dev/null
  fi
  # What the other phases read back (load, snapshot, report).
  printf '%s\n' "$label" "$port" "$pid" "$workers" "$header" "$more" "$target" "$method" "$ids" > "$dir/side"
}

side() {  # side DIR: the start's figures as variables of the caller (label port pid workers header more target method ids)
  { read -r label; read -r port; read -r pid; read -r workers; read -r header; read -r more; read -r target
    read -r method; read -r ids; } < "$1/side"
}

load() {  # load DIR SECONDS warm|measured [ARG...]: wrk's load on the side's server (its output)
  local dir=$1 seconds=$2 phase=$3 label port pid workers header more target method ids first=0
  shift 3
  side "$dir"
  [ "$phase" = measured ] && first=$((ids / 2))  # CASE=miss: the measured run from the middle
  # shellcheck disable=SC2206 # ON_FIRST is empty or "taskset -c 0", two words
  local run=($ON_FIRST wrk -t1 -c"$CONNECTIONS" -s loadtest/bench/wrk.lua -H "$header")
  [ -n "$more" ] && run+=(-H "$more")
  run+=("http://127.0.0.1:$port/v1/bench/$target")
  BENCH_IDS=$ids BENCH_FIRST_ID=$first BENCH_PATH_PREFIX=/v1/bench/m BENCH_METHOD=$method \
    BENCH_BODY_FILE="$dir/small.json" "${run[@]}" -d"$seconds"s "$@"
}

snapshot() {  # snapshot DIR: the ticks so far of the server (master and workers), its workers, their main threads, Redis
  local dir=$1 label port pid workers header more target method ids pids
  side "$dir"
  read -ra pids <<< "$workers"
  echo "$(cpu_ticks "$pid" "${pids[@]}") $(cpu_ticks "${pids[@]}") $(main_ticks "${pids[@]}") $(cpu_ticks "$(cat "$dir/r.pid")")"
}

report() {  # report DIR OUTPUT SNAPSHOT_BEFORE SNAPSHOT_AFTER COUNTS_BEFORE COUNTS_AFTER: the side's result line
  local dir=$1 out=$2 label port pid workers header more target method ids pids n rss
  side "$dir"
  read -ra pids <<< "$workers"
  local t0 w0 m0 r0 t1 w1 m1 r1
  read -r t0 w0 m0 r0 <<< "$3"
  read -r t1 w1 m1 r1 <<< "$4"
  rss=$(for w in "${pids[@]}"; do awk '/VmRSS/ {print $2}' "/proc/$w/status"; done | sort -n | tail -1)
  [ -n "${VERBOSE:-}" ] && echo "$out" >&2
  n=$(echo "$out" | awk '/requests in/ {print $1}')
  echo "$out" | awk -v l="$label" -v n="$n" -v c=$((t1 - t0)) -v rc=$((r1 - r0)) -v hz="$(getconf CLK_TCK)" -v rss="$rss" \
    -v counts="$5 $6" -v main=$((m1 - m0)) -v others=$((w1 - w0 - (m1 - m0))) \
    'BEGIN {split(counts, k, " ")} /Requests\/sec/ {r=$2} / 99%/ {p=$2}
     END {printf "%s cpu_us_per_request=%.1f rps=%s p99=%s rss_mb=%.0f redis_cpu_us_per_request=%.1f invalidations_per_request=%.3f hits_per_request=%.3f evictions_per_request=%.3f main_us_per_request=%.2f threads_us_per_request=%.2f\n",
       l, c*1e6/hz/n, r, p, rss/1024, rc*1e6/hz/n, (k[4]-k[1])/n, (k[5]-k[2])/n, (k[6]-k[3])/n, main*1e6/hz/n, others*1e6/hz/n}'
}

stop_side() {  # stop_side DIR: its server and its Redis
  kill "$(cat "$1/server.pid")"; wait "$(cat "$1/server.pid")" 2>/dev/null || true
  kill "$(cat "$1/r.pid")"
  rm -f "$1/server.pid" "$1/r.pid"
}

counts_of() {  # counts_of DIR: the side's hot-cache counts (cache_counts)
  local label port pid workers header more target method ids
  side "$1"
  cache_counts "$port"
}

run() {  # run TREE LABEL AUTH EXTRA_ENV EXTRA_HEADER RULE: one server, warm-up, one measured run
  local dir out snap0 snap1 counts0 counts1
  dir=$(mktemp -d -p "$WORK")
  start_side "$dir" "$@"
  load "$dir" "${WARM:-10}" warm > /dev/null
  counts0=$(counts_of "$dir")
  snap0=$(snapshot "$dir")
  out=$(load "$dir" "${DUR:-5}" measured --latency)
  snap1=$(snapshot "$dir")
  counts1=$(counts_of "$dir")
  report "$dir" "$out" "$snap0" "$snap1" "$counts0" "$counts1"
  stop_side "$dir"
}

# Each side's tree, label and settings, as run and start_side take them.
SIDE_A=("$WORK/a" "A=$A" "${AUTH_A:-off}" "${ENV_A:-}" "${HEADER_A:-}" "${RULE_A:-}")
SIDE_B=("$WORK/b" "B=$B" "${AUTH_B:-off}" "${ENV_B:-}" "${HEADER_B:-}" "${RULE_B:-}")

together() {  # together: A's and B's servers at once, warmed and measured side by side, each under its own wrk
  local a b wa a0 b0 a1 b1 ca0 cb0 ca1 cb1
  a=$(mktemp -d -p "$WORK") b=$(mktemp -d -p "$WORK")
  start_side "$a" "${SIDE_A[@]}"
  start_side "$b" "${SIDE_B[@]}"
  load "$a" "${WARM:-10}" warm > /dev/null &
  wa=$!
  load "$b" "${WARM:-10}" warm > /dev/null
  wait "$wa"  # (a bare wait would wait for the servers too)
  ca0=$(counts_of "$a") cb0=$(counts_of "$b")
  a0=$(snapshot "$a") b0=$(snapshot "$b")
  load "$a" "${DUR:-5}" measured --latency > "$a/out" &
  wa=$!
  load "$b" "${DUR:-5}" measured --latency > "$b/out"
  wait "$wa"
  a1=$(snapshot "$a") b1=$(snapshot "$b")
  ca1=$(counts_of "$a") cb1=$(counts_of "$b")
  report "$a" "$(cat "$a/out")" "$a0" "$a1" "$ca0" "$ca1"
  report "$b" "$(cat "$b/out")" "$b0" "$b1" "$cb0" "$cb1"
  stop_side "$a"
  stop_side "$b"
}

run_a() { run "${SIDE_A[@]}"; }
run_b() { run "${SIDE_B[@]}"; }
# A B, B A, A B, ...: the run second in a pair measured the cheaper, whichever
# revision it was (two revisions 6 Deferred callbacks apart, 10 KB reads, 4
# pairs each way: 44.3 vs 39.5 us with one first, 40.7 vs 34.9 with the other),
# so each side takes each place in turn.
for round in $(seq "$ROUNDS"); do
  if [ "${TOGETHER:-}" = 1 ]; then together
  elif [ $((round % 2)) = 1 ]; then run_a; run_b; else run_b; run_a; fi
done | tee "$WORK/results"
for label in "A=$A" "B=$B"; do
  for figure in cpu_us_per_request redis_cpu_us_per_request; do
    grep -F "$label " "$WORK/results" | sed "s/.* $figure=\([0-9.]*\).*/\1/" | sort -n |
      awk -v l="$label" -v f="$figure" '{v[NR]=$1} END {printf "%s median %s=%.1f over %d runs\n", l, f, v[int((NR+1)/2)], NR}'
  done
done
if [ "${TOGETHER:-}" = 1 ]; then  # each round's B / A, its two servers measured over the same seconds
  ratios=$(sed -n "s/.* cpu_us_per_request=\([0-9.]*\).*/\1/p" "$WORK/results" | paste - - | awk '{printf "%.3f\n", $2/$1}')
  echo "B/A cpu_us_per_request per round: $(echo "$ratios" | tr '\n' ' ')median $(echo "$ratios" | sort -n |
    awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}')"
fi
