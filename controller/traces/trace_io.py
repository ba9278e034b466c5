"""Reading the input files of the offline tools: the one place that opens a trace,
parses its times, its CSV rows or its Standard Workload Format jobs, and counts the
rows a tool leaves out.

- `open_text`: a file as text, decompressed by its first bytes (gzip, bzip2, xz),
  whatever its name says; UTF-8 with or without a byte-order mark.
- `parse_time` / `parse_datetime`: epoch seconds or ISO 8601 (no zone: UTC).
- `csv_records`: a CSV file with a header row naming at least some columns; rows as
  dicts with their line numbers; blank rows are passed over.
- `read_swf`: a Standard Workload Format trace (the Parallel Workloads Archive's,
  https://www.cs.huji.ac.il/labs/parallel/workload/swf.html): ';' starts a header
  or comment line, 18 numeric fields per job separated by any whitespace, -1 is a
  missing value in any field (NaN here).
- `Skipped`: rows left out, counted per reason, for the notes a tool prints, and the
  error when a file leaves nothing to work on.

Every problem is a `TraceError` naming the file and, where there is one, the line
(`path:line: problem`).
"""

from __future__ import annotations

import bz2
import csv
import gzip
import io
import lzma
import math
import zlib
from array import array
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

import numpy as np

from controller.errors import SpotbagError


class TraceError(SpotbagError, ValueError):
    """An input file that cannot be read; the message names the file, the line and
    the problem."""

    exit_code = 2


# --- opening -------------------------------------------------------------------------

_COMPRESSED = (
    (b"\x1f\x8b", gzip.open),
    (b"BZh", bz2.open),
    (b"\xfd7zXZ\x00", lzma.open),
)
_ARCHIVES = ((b"PK\x03\x04", "a zip archive"), (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive"))


@contextmanager
def open_text(path: str | Path, *, errors: str = "strict") -> Iterator[TextIO]:
    """`path` as UTF-8 text (newline=''), decompressed when its first bytes are those
    of gzip, bzip2 or xz. `errors='replace'` reads undecodable bytes as U+FFFD."""
    path = Path(path)
    try:
        with path.open("rb") as probe:
            head = probe.read(8)
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise TraceError(f"{path}: is a directory, not a file") from None
    except OSError as exc:
        raise TraceError(f"cannot read {path}: {exc.strerror or exc}") from None
    for magic, kind in _ARCHIVES:
        if head.startswith(magic):
            raise TraceError(f"{path}: is {kind}; extract the trace from it first")
    opener = next((open_ for magic, open_ in _COMPRESSED if head.startswith(magic)), None)
    raw = opener(path, "rb") if opener else path.open("rb")
    with io.TextIOWrapper(raw, encoding="utf-8-sig", errors=errors, newline="") as text:
        try:
            yield text
        except UnicodeDecodeError as exc:
            raise TraceError(f"{path}: not UTF-8 text (byte {exc.start} of a chunk)") from None
        except (EOFError, zlib.error, lzma.LZMAError, gzip.BadGzipFile) as exc:
            raise TraceError(f"{path}: damaged or truncated compressed data: {exc}") from None
        except OSError as exc:  # bz2's "Invalid data stream" and the like
            raise TraceError(f"cannot read {path}: {exc}") from None


# --- times ---------------------------------------------------------------------------


def parse_datetime(text: str) -> datetime:
    """Epoch seconds (e.g. 1583160579) or ISO 8601 (2020-03-02T14:49:39Z,
    '2015-03-01 00:00:00+00:00'; no zone means UTC) -> an aware datetime."""
    value = text.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(f"cannot read {text!r} as epoch seconds or ISO 8601") from None
        return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
    if not math.isfinite(seconds):
        raise ValueError(f"{text!r} is not a finite time")
    return datetime.fromtimestamp(seconds, UTC)


def parse_time(text: str) -> float:
    """Epoch seconds or ISO 8601 (no zone: UTC) -> epoch seconds."""
    value = text.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:  # what parse_datetime does, without trying float() again (a trace's every row)
            moment = datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(f"cannot read {text!r} as epoch seconds or ISO 8601") from None
        return (moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)).timestamp()
    if not math.isfinite(seconds):
        raise ValueError(f"{text!r} is not a finite time")
    return seconds


# --- skipped rows --------------------------------------------------------------------


@dataclass
class Skipped:
    """Rows a reader left out, per reason (first reason that applies)."""

    what: str = "row"  # "job", "row": what the file's rows are
    counts: Counter[str] = field(default_factory=Counter)

    def add(self, reason: str, count: int = 1) -> None:
        if count:
            self.counts[reason] += count

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def by_reason(self) -> dict[str, int]:
        return dict(self.counts.most_common())

    def notes(self) -> list[str]:
        """One line per reason, the most frequent first."""
        return [f"{n:,} {self.what}(s) skipped: {why}" for why, n in self.counts.most_common()]

    def require_kept(self, kept: int, path: str | Path) -> None:
        """A TraceError when nothing is left: the file had no rows, or every row was
        skipped (with how many and why)."""
        if kept:
            return
        if not self.total:
            raise TraceError(f"{path}: no {self.what}s in the file")
        reasons = "; ".join(f"{n:,} {why}" for why, n in self.counts.most_common())
        raise TraceError(f"{path}: none of its {self.total:,} {self.what}s is usable ({reasons})")


# --- CSV -----------------------------------------------------------------------------


@dataclass
class CsvTable:
    """An open CSV file: its header and its rows (iterate once)."""

    path: Path
    header: list[str]
    rows: Iterator[tuple[int, dict[str, str]]]  # (line, column -> stripped text)

    def __iter__(self) -> Iterator[tuple[int, dict[str, str]]]:
        return self.rows


@contextmanager
def csv_records(path: str | Path, required: Sequence[str]) -> Iterator[CsvTable]:
    """A CSV file (gzip or not) with a header row that names at least `required`:

        with csv_records(path, ("start", "end")) as table:
            for line, row in table: ...

    Cells and column names are stripped; blank rows are passed over; a row with more
    or fewer fields than the header is an error naming its line."""
    path = Path(path)
    with open_text(path) as handle:
        reader = csv.reader(handle)
        try:
            first = next(reader, None)
        except csv.Error as exc:
            raise TraceError(f"{path}:1: {exc}") from None
        if first is None:
            raise TraceError(
                f"{path}:1: the file is empty; expected a header row naming {', '.join(required)}"
            )
        header = [name.strip() for name in first]
        missing = [name for name in required if name not in header]
        if missing:
            raise TraceError(
                f"{path}:1: the header lacks column(s) {', '.join(missing)} "
                f"(found: {', '.join(header) or 'nothing'})"
            )
        yield CsvTable(path, header, _csv_rows(reader, header, path))


def _csv_rows(reader, header: list[str], path: Path) -> Iterator[tuple[int, dict[str, str]]]:
    width = len(header)
    while True:
        try:
            row = next(reader, None)
        except csv.Error as exc:
            raise TraceError(f"{path}:{reader.line_num}: {exc}") from None
        if row is None:
            return
        cells = [cell.strip() for cell in row]  # a list, not generators: 274,100 rows a trace
        if not any(cells):
            continue
        if len(cells) != width:
            raise TraceError(
                f"{path}:{reader.line_num}: {len(cells)} fields, but the header has {width}"
            )
        yield reader.line_num, dict(zip(header, cells, strict=True))


# --- the Standard Workload Format ----------------------------------------------------

# The 18 fields of a job, in order (1-based in the standard: field 2 is submit_s).
SWF_FIELDS = (
    "job",
    "submit_s",
    "wait_s",
    "run_s",
    "allocated_procs",
    "cpu_time_s",
    "memory_kb",
    "requested_procs",
    "requested_time_s",
    "requested_memory_kb",
    "status",
    "user",
    "group",
    "executable",
    "queue",
    "partition",
    "preceding_job",
    "think_time_s",
)
SWF_MISSING = -1.0


@dataclass(frozen=True)
class SwfTrace:
    """The jobs of an SWF file: one row per job, one column per field of SWF_FIELDS,
    NaN where the trace has -1 (missing)."""

    path: Path
    table: np.ndarray  # (jobs, 18) float
    lines: np.ndarray  # (jobs,) the line each job is on
    unix_start_s: float | None  # header UnixStartTime: submit times count from it
    names: dict[str, dict[str, str]]  # "partition"/"queue" -> number -> name (header)

    def __len__(self) -> int:
        return int(self.table.shape[0])

    def column(self, name: str) -> np.ndarray:
        return self.table[:, SWF_FIELDS.index(name)]


def _swf_header(text: str, number: int, path: Path, header: dict) -> None:
    key, _, value = text[1:].partition(":")
    key, value = key.strip().lower(), value.strip()
    if key == "unixstarttime":
        try:
            header["unix_start_s"] = float(value)
        except ValueError:
            raise TraceError(f"{path}:{number}: UnixStartTime {value!r} is not a number") from None
    elif key in ("partition", "queue") and value:
        ident, _, name = value.partition(" ")
        header["names"][key][ident] = name.strip() or ident


def read_swf(path: str | Path) -> SwfTrace:
    """Every job of an SWF file (gzip or not); a line that is not 18 finite numbers is
    an error naming it. Values of -1 become NaN; other values are left as they are."""
    path = Path(path)
    header: dict = {"unix_start_s": None, "names": {"partition": {}, "queue": {}}}
    values = array("d")
    lines = array("l")
    width = len(SWF_FIELDS)
    with open_text(path, errors="replace") as handle:
        for number, raw in enumerate(handle, start=1):
            text = raw.strip()
            if not text:
                continue
            if text.startswith(";"):
                _swf_header(text, number, path, header)
                continue
            fields = text.split()
            if len(fields) != width:
                raise TraceError(
                    f"{path}:{number}: expected {width} fields, found {len(fields)}: {text[:80]!r}"
                )
            try:
                numbers = [float(f) for f in fields]
            except ValueError:
                bad = next(i for i, f in enumerate(fields) if not _is_number(f))
                raise TraceError(
                    f"{path}:{number}: field {bad + 1} ({SWF_FIELDS[bad]}) "
                    f"{fields[bad]!r} is not a number"
                ) from None
            if not all(math.isfinite(v) for v in numbers):
                raise TraceError(f"{path}:{number}: every field must be a finite number")
            values.extend(numbers)
            lines.append(number)
    table = np.frombuffer(values, dtype=float).reshape(-1, width).copy()
    table[table == SWF_MISSING] = np.nan
    return SwfTrace(
        path,
        table,
        np.frombuffer(lines, dtype=np.dtype(f"i{lines.itemsize}")).astype(np.int64),
        header["unix_start_s"],
        header["names"],
    )


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
