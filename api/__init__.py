"""Assembly: settings, the route table, the server process, the CLI."""
