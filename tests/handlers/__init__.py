"""Tests of the API's operations as a client sees them, and of handlers/ modules."""
