-- wrk script of the load-test gate's busy phase (loadtest/_busy.py).
--
-- Four reads of a ~100 B document to one PUT of it, over GATE_DOCS documents
-- in turn, each with the token in GATE_TOKEN: the two hottest operations,
-- with authorization on. done() prints one line, `BUSY {...}`, that
-- loadtest/_busy.py reads: the requests wrk completed and its error counts
-- (any status of 400 or more counts in "status").

local token = os.getenv("GATE_TOKEN") or ""
local docs = tonumber(os.getenv("GATE_DOCS") or "50")
local prefix = os.getenv("GATE_PATH_PREFIX") or "/v1/gate/d"
local body = '{"name":"Ada Lovelace","email":"ada@example.com","tags":["math","engines"],"score":97.5}'
local read_headers = {}
local write_headers = {["Content-Type"] = "application/json"}
if token ~= "" then
  read_headers["Authorization"] = "Bearer " .. token
  write_headers["Authorization"] = "Bearer " .. token
end
local n = 0

request = function()
  n = n + 1
  local path = prefix .. (n % docs)
  if n % 5 == 0 then
    return wrk.format("PUT", path, write_headers, body)
  end
  return wrk.format("GET", path, read_headers)
end

function done(summary, latency, requests)
  local errors = summary.errors
  io.write(string.format(
    'BUSY {"requests":%d,"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d}\n',
    summary.requests, errors.connect, errors.read, errors.write, errors.status, errors.timeout))
end
