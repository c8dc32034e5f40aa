"""HTTP handlers: one module per resource, on a shared JSON base handler."""
