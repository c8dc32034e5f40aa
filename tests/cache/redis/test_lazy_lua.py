"""cache.redis.lazy_lua on the suite's redis-server: rare functions made on first use behave as when made at once."""

from __future__ import annotations

import pytest

from cache.documents import scripts
from cache.redis.lazy_lua import made_on_first_use

DEFINITIONS = """
local calls = 0
local function double(x)
  return 2 * x
end
local function quadruple(x)
  calls = calls + 1
  return double(double(x))
end
local function common(x)
  local y = x + 1
  if x > 10 then
    y = y + 0
    quadruple(0)
  end
  if x > 100 then return quadruple(x) end
  return y
end
"""


def run(client, definitions: str, x: int):
    return client.eval(definitions + "return {common(tonumber(ARGV[1])), calls}\n", 0, x)


@pytest.mark.parametrize("x", [1, 11, 101])
def test_a_script_answers_the_same_with_its_rare_functions_made_on_first_use(redis_client, x: int) -> None:
    lazy = made_on_first_use(DEFINITIONS, ["double", "quadruple"])
    assert "local function double" not in lazy.split("make_rare = function()")[0]
    # A call that opens a statement ("quadruple(0)" after "y = y + 0") is not Lua 5.1's
    # "ambiguous syntax"; state outside the loader is shared; a call made no function until one was needed.
    assert run(redis_client, lazy, x) == run(redis_client, DEFINITIONS, x)


def test_the_rare_functions_are_not_made_on_a_path_that_calls_none(redis_client) -> None:
    lazy = made_on_first_use(DEFINITIONS, ["double", "quadruple"]) + "local before = tostring(make_rare)\n"
    check = "common(tonumber(ARGV[1]))\nreturn before == tostring(make_rare) and 1 or 0\n"
    assert redis_client.eval(lazy + check, 0, 1) == 1  # the loader is not replaced: nothing was made
    assert redis_client.eval(lazy + check, 0, 11) == 0  # made, and replaced by the table's getter


def test_a_rare_function_taken_as_a_value_or_defined_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="taken as a value"):
        made_on_first_use(DEFINITIONS + "local f = quadruple\n", ["quadruple"])
    with pytest.raises(ValueError, match="2 top-level definitions"):
        made_on_first_use(DEFINITIONS + "local function double(x)\n  return x\nend\n", ["double"])
    with pytest.raises(ValueError, match="loader's name"):
        made_on_first_use(DEFINITIONS + "local make_rare = 1\n", ["double"])


def test_the_write_scripts_load_and_keep_their_rare_functions_out_of_the_call(redis_client) -> None:
    for script in (scripts.PUT, scripts.DELETE, scripts.WRITE_MANY):
        assert redis_client.script_load(script.source) == script.sha.decode()
        head = script.source.decode().split("make_rare = function()")[0]
        assert "local function move_entries" not in head and "local function trim_feed" not in head
        assert "local function put" in head or "local function delete" in head
