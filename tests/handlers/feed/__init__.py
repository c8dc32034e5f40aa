"""Tests of handlers/feed/: the change feed's serving side."""
