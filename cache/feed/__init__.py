"""The change feed: its streams in Redis, positions, the workers' nudges, live queries."""
