"""A streaming parity reconciler built on statelog: the demo behind ``make demo``."""
