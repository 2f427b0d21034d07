"""Benchmarks for responses-ws: `python -m benchmarks [suite ...] [--quick] [--out DIR]`."""
