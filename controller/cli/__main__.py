"""`python -m controller.cli`: the `spotbag` command."""

from controller.cli import main

main()
