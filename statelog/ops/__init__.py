"""statelog.ops."""
