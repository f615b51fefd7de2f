"""Benchmarks, run as `connect-coordinator bench NAME` (figures in BENCHMARKS.md).

Not part of the server: they drive the coordinator, its log and its wire codec from
outside, and nothing under `coordinator` or `protocol` imports them.
"""
