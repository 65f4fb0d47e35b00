"""The project's own tools: benchmarks, accuracy studies, MTA harnesses, generators.

Not part of the installed package (only ``spamnb`` is). Each script puts the
project's root on ``sys.path`` and imports its neighbours as ``tools.KIND.NAME``;
see tools/README.md for what each folder holds and the command that runs each file.
"""
