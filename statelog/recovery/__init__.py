"""statelog.recovery."""
