"""Benchmarks behind the `make bench-*` targets (each ends by printing one JSON line of figures)."""
