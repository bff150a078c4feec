"""statelog.format."""
