"""tools/benchmarks: see tools/benchmarks/README.md."""
