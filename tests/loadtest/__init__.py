"""Tests of loadtest/: the load-test gate's figures and tools."""
