#!/usr/bin/env python3
"""`spotbag ARGS...` with the reference loop run through it (targets.LoopsThrough): the
command itself, in this process, whose slices of the loop's CPU seconds are written to
the file named first, as a JSON list.

    python bench/cli_with_loops.py SLICES.json simulate bag.json --config fleet.toml
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from targets import LoopsThrough


def main() -> None:
    slices_file = Path(sys.argv[1])
    sys.argv = ["spotbag", *sys.argv[2:]]
    code: int | str | None = 0
    with LoopsThrough() as loops:
        try:
            from controller.cli import main as spotbag

            spotbag()
        except SystemExit as exit_:
            code = exit_.code
        finally:
            slices_file.write_text(json.dumps(loops.slices_s))
    sys.exit(code)


if __name__ == "__main__":
    main()
