"""tools/generators: see tools/generators/README.md."""
