"""Benchmarks (`make bench`): they print their figures; tests never assert timings."""
