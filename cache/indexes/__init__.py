"""Declared indexes: their spec, the values they sort, the Lua that keeps them exact, their builds and queries."""
