"""Tests of the stores in cache/ (one module each), the driver's in redis/."""
