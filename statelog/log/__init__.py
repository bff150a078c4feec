"""statelog.log."""
