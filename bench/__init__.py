"""Benchmarks (not run by CI): ``python -m bench --help``."""
