"""statelog.state."""
