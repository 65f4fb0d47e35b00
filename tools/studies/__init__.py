"""tools/studies: see tools/studies/README.md."""
