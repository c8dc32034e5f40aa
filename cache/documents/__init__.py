"""Documents in Redis: the store, its reads, writes and pages, the write plan and the Lua that applies it."""
