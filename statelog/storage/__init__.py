"""statelog.storage."""
