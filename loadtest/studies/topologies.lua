-- wrk script of loadtest/studies/_topologies.py: requests spread over many documents.
--
-- TOPO_CASE picks the request: get (one of TOPO_DOCS documents at random),
-- put (overwrite one at random), many (a multi-get of 20 random ids), page
-- (a list page of 100). done() prints one line, `TOPO {...}`.

local case = os.getenv("TOPO_CASE") or "get"
local docs = tonumber(os.getenv("TOPO_DOCS") or "1000")
local body = '{"id":"x","name":"a record of about two hundred bytes","active":true,"score":12.5,' ..
  '"tags":["alpha","beta"],"lines":[{"sku":"A-1","qty":2},{"sku":"B-22","qty":1}],"note":"written by wrk"}'
local headers = {["Content-Type"] = "application/json"}

request = function()
  if case == "put" then
    return wrk.format("PUT", "/v1/bench/d" .. math.random(1, docs), headers, body)
  elseif case == "many" then
    local ids = {}
    for i = 1, 20 do ids[i] = "d" .. math.random(1, docs) end
    return wrk.format("GET", "/v1/bench?ids=" .. table.concat(ids, ","))
  elseif case == "page" then
    return wrk.format("GET", "/v1/bench?limit=100")
  end
  return wrk.format("GET", "/v1/bench/d" .. math.random(1, docs))
end

function done(summary, latency, requests)
  local errors = summary.errors
  io.write(string.format(
    'TOPO {"requests":%d,"duration_us":%d,"errors":%d,"non2xx":%d,"p50_us":%d,"p99_us":%d}\n',
    summary.requests, summary.duration, errors.connect + errors.read + errors.write + errors.timeout,
    errors.status, latency:percentile(50), latency:percentile(99)))
end
