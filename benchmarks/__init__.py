"""qclient's benchmark suite: `python -m benchmarks` runs every scenario and writes the report."""
