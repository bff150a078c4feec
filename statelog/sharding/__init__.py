"""statelog.sharding."""
