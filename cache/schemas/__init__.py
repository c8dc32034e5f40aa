"""Collection schemas (JSON Schema 2020-12): checked, bounded, compiled and run; no Redis in here."""
