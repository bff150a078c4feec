"""Examples of statelog in use (run from the project root)."""
