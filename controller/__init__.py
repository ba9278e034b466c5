"""The spotbag controller: store, scheduler, HTTP API and CLI.

This package is the only place that wires policies, drivers and executors
together, and the only place with side effects on the store.
"""
