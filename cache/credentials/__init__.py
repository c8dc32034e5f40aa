"""Credentials: tokens, their worker cache, tickets, rate limits, and the watch that ends what outlives one."""
