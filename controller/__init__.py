"""The spotbag controller: store, scheduler, HTTP API and CLI.

This package is the only place that wires policies, drivers and executors
together, and the only place with side effects on the store.
"""

# The one place the version is written: pyproject.toml reads it (tool.setuptools.dynamic)
# and `spotbag --version` prints it.
__version__ = "0.1.0"
