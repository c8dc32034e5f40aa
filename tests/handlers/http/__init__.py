"""Tests of handlers/http/: authorization, errors, CORS, caching, conditions, negotiation."""
