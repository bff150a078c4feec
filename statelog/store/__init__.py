"""statelog.store."""
