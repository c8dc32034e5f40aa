-- wrk script of _identity_cost.py: each request sends the next bearer token of TOKENS_FILE (one a line), in
-- turn, from the first again after the last. A file of one token is the same load with a repeated token.

local tokens = {}
for line in io.lines(os.getenv("TOKENS_FILE")) do
  tokens[#tokens + 1] = line
end
local n = 0

request = function()
  n = n % #tokens + 1
  return wrk.format(nil, nil, { Authorization = "Bearer " .. tokens[n] })
end
