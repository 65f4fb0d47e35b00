"""Storage: where models live, atomic saves and locks, trust checks, the compiled scorer.

Sits above :mod:`spamnb.scale` because the default model is built by training
on the shipped corpus the first time it is needed.
"""
