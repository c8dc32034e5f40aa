-- wrk script of `make bench`: one request, built once, and the summary as JSON.
--
-- BENCH_METHOD (default GET) and BENCH_BODY_FILE (the body of a PUT) come
-- from the environment; BENCH_IDS=N makes GETs go to BENCH_PATH_PREFIX .. 0,
-- 1, ..., N-1 in turn (from BENCH_FIRST_ID, default 0), so no document is
-- read again before N others (a cache's miss path), or at random with
-- BENCH_RANDOM=1. done() prints one line, `BENCH {...}`, that the
-- bench reads; latencies are in microseconds.

local method = os.getenv("BENCH_METHOD") or "GET"
if method ~= "GET" then
  wrk.method = method
  local file = assert(io.open(os.getenv("BENCH_BODY_FILE"), "rb"))
  wrk.body = file:read("*a")
  file:close()
  wrk.headers["Content-Type"] = "application/json"
end

local ids = tonumber(os.getenv("BENCH_IDS") or "0")
if ids > 0 then
  local prefix = os.getenv("BENCH_PATH_PREFIX")
  local n = tonumber(os.getenv("BENCH_FIRST_ID") or "0") - 1
  local random = os.getenv("BENCH_RANDOM") == "1"
  request = function()
    n = random and math.random(0, ids - 1) or (n + 1) % ids
    return wrk.format(nil, prefix .. n)
  end
end

function done(summary, latency, requests)
  local errors = summary.errors
  io.write(string.format(
    'BENCH {"requests":%d,"duration_us":%d,"bytes":%d,"connect":%d,"read":%d,"write":%d,"status":%d,' ..
    '"timeout":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,"max_us":%d,"mean_us":%.1f}\n',
    summary.requests, summary.duration, summary.bytes, errors.connect, errors.read, errors.write,
    errors.status, errors.timeout, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency.max, latency.mean))
end
