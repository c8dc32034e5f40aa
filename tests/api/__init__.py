"""Tests of api/ modules: configuration, the connection's parts, logs, metrics."""
