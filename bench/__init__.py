"""Benchmark harness for conveyor: ``python -m bench --help``."""
