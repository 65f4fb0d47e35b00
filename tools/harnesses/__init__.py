"""tools/harnesses: see tools/harnesses/README.md."""
