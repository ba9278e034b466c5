"""Pure policies: the math of docs/design.md as functions of arrays and frozen dataclasses.

Nothing in this package does I/O, reads a clock or uses a global random state:
callers pass `now` and a `numpy.random.Generator`.
"""
