"""Batches: many document operations in one request, planned in segments, within a byte budget."""
