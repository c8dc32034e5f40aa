"""Tests of the Redis driver, cache/redis/."""
