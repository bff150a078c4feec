"""statelog.compaction."""
