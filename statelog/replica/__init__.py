"""A standby's side of a store: mirroring its source and following it."""
