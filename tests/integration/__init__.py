"""End-to-end durability tests: real files with fsync, real TCP, real processes."""
