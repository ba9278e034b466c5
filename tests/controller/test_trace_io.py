"""controller.traces.trace_io, the one reader of the offline tools' input files, and the tools
that read through it (`spotbag fit`'s lifetimes, the price traces of `index` and
`simulate-hopping`): compressed files by their bytes, SWF per the standard, CSV rows
with their lines, times, and files that leave nothing to work on. Files are tiny and
written in tmp_path."""

from __future__ import annotations

import bz2
import gzip
import lzma
import math
import time
import zipfile
from datetime import UTC, datetime

import pytest
from click.testing import CliRunner

from controller.cli import cli
from controller.tools.lifetime_data import LifetimeDataError, read_lifetimes
from controller.traces.price_trace import read_trace
from controller.traces.trace_io import (
    SWF_FIELDS,
    Skipped,
    TraceError,
    csv_records,
    open_text,
    parse_datetime,
    parse_time,
    read_swf,
)

TEXT = "a,b\n1,2\n"


@pytest.mark.parametrize(
    ("name", "pack"),
    [
        ("plain.csv", str.encode),
        ("packed.csv.gz", lambda t: gzip.compress(t.encode())),
        ("packed_without_suffix.csv", lambda t: gzip.compress(t.encode())),
        ("packed.csv.bz2", lambda t: bz2.compress(t.encode())),
        ("packed.csv.xz", lambda t: lzma.compress(t.encode())),
        ("bom.csv", lambda t: b"\xef\xbb\xbf" + t.encode()),
    ],
)
def test_files_are_opened_by_their_bytes(tmp_path, name, pack):
    path = tmp_path / name
    path.write_bytes(pack(TEXT))
    with open_text(path) as handle:
        assert handle.read() == TEXT


def test_files_that_cannot_be_read_are_named(tmp_path):
    with (
        pytest.raises(TraceError, match=r"absent\.csv: no such file"),
        open_text(tmp_path / "absent.csv"),
    ):
        pass
    with pytest.raises(TraceError, match="is a directory"), open_text(tmp_path):
        pass
    archive = tmp_path / "trace.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("trace.csv", TEXT)
    with pytest.raises(TraceError, match=r"trace\.zip: is a zip archive"), open_text(archive):
        pass
    latin = tmp_path / "latin.csv"
    latin.write_bytes("a,b\ncaf\xe9,1\n".encode("latin-1"))
    with pytest.raises(TraceError, match=r"latin\.csv: not UTF-8 text"), open_text(latin) as f:
        f.read()
    truncated = tmp_path / "cut.csv.gz"
    truncated.write_bytes(gzip.compress(TEXT.encode() * 1000)[:40])
    with (
        pytest.raises(TraceError, match=r"cut\.csv\.gz: damaged or truncated"),
        open_text(truncated) as f,
    ):
        f.read()


def test_times_are_epoch_seconds_or_iso_8601_with_utc_by_default():
    assert parse_time("1583160579") == 1583160579.0
    assert parse_time("2020-03-02T14:49:39Z") == 1583160579.0
    assert parse_time("2020-03-02 14:49:39") == 1583160579.0
    assert parse_time("2020-03-02T16:49:39+02:00") == 1583160579.0
    assert parse_datetime("1583160579") == datetime(2020, 3, 2, 14, 49, 39, tzinfo=UTC)
    assert parse_datetime("2019-03-25T12:22:36-07:00").utcoffset().total_seconds() == -7 * 3600
    for bad in ("yesterday", "nan", "inf"):
        with pytest.raises(ValueError, match=bad):
            parse_time(bad)


def test_csv_rows_come_with_their_lines(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text(' a , b \n1, x\n\n"2\nmore",y\n3,z\n')
    with csv_records(path, ("a",)) as table:
        assert table.header == ["a", "b"]
        rows = list(table)
    assert rows == [
        (2, {"a": "1", "b": "x"}),
        (5, {"a": "2\nmore", "b": "y"}),
        (6, {"a": "3", "b": "z"}),
    ]
    path.write_text("a,b\n1,2,3\n")
    with (
        pytest.raises(TraceError, match=r"rows\.csv:2: 3 fields, but the header has 2"),
        csv_records(path, ("a",)) as table,
    ):
        list(table)
    with (
        pytest.raises(TraceError, match=r"rows\.csv:1: the header lacks column\(s\) c"),
        csv_records(path, ("a", "c")),
    ):
        pass


def swf(body: str) -> str:
    return "; UnixStartTime: 100\n; Partition: 2 batch\n; Queue: 1 short\n;\n" + body


def test_swf_minus_one_is_missing_in_any_field(tmp_path):
    path = tmp_path / "t.swf"
    fields = ["7", "10", "-1", "30", "4"] + ["-1"] * 9 + ["1", "2", "-1", "-1"]
    path.write_text(swf(" ".join(fields) + "\n"))
    trace = read_swf(path)
    assert len(trace) == 1 and trace.unix_start_s == 100.0
    assert trace.names == {"partition": {"2": "batch"}, "queue": {"1": "short"}}
    row = dict(zip(SWF_FIELDS, trace.table[0].tolist(), strict=True))
    assert row["job"] == 7 and row["submit_s"] == 10 and row["run_s"] == 30
    assert math.isnan(row["wait_s"]) and math.isnan(row["memory_kb"])
    assert row["queue"] == 1 and row["partition"] == 2
    assert trace.lines.tolist() == [5]


def test_a_compressed_swf_is_read(tmp_path):
    text = swf(" ".join(["1", "0", "0", "5", "2"] + ["-1"] * 13) + "\n")
    path = tmp_path / "t.swf.gz"
    path.write_bytes(gzip.compress(text.encode()))
    assert len(read_swf(path)) == 1


def test_skipped_rows_are_counted_per_reason_and_none_kept_is_an_error():
    skipped = Skipped("job")
    skipped.add("unknown run time", 3)
    skipped.add("no processors")
    skipped.add("never", 0)
    assert skipped.total == 4
    assert skipped.notes() == [
        "3 job(s) skipped: unknown run time",
        "1 job(s) skipped: no processors",
    ]
    skipped.require_kept(1, "t.swf")
    with pytest.raises(TraceError, match=r"t.swf: none of its 4 jobs is usable \(3 unknown run"):
        skipped.require_kept(0, "t.swf")
    with pytest.raises(TraceError, match=r"t\.swf: no jobs in the file"):
        Skipped("job").require_kept(0, "t.swf")


# --- the tools that read through it --------------------------------------------------

LIFETIMES = "name,machine_type,zone,insert_time,end_time,lifetime_s,event,idle\n" + "".join(
    f"vm{i},n1-highcpu-4,us-east1-b,2019-03-25T12:00:00-07:00,,{600 + 900 * i},"
    f"{'preempted' if i % 3 else 'stop'},non-idle\n"
    for i in range(40)
)


def test_fit_reads_gzipped_lifetimes(tmp_path):
    path = tmp_path / "lifetimes.csv.gz"
    path.write_bytes(gzip.compress(LIFETIMES.encode()))
    observations = read_lifetimes(path)
    assert len(observations) == 40 and observations[1].preempted
    result = CliRunner().invoke(cli, ["fit", str(path), "--json"])
    assert result.exit_code == 0, result.output
    assert '"n": 40' in result.stdout


def test_a_lifetime_file_without_rows_is_refused(tmp_path):
    path = tmp_path / "none.csv"
    path.write_text(LIFETIMES.splitlines()[0] + "\n")
    with pytest.raises(LifetimeDataError, match=r"none\.csv: no lifetimes in the file"):
        read_lifetimes(path)
    result = CliRunner().invoke(cli, ["fit", str(path)])
    assert result.exit_code == 1 and "no lifetimes in the file" in result.output
    missing = CliRunner().invoke(cli, ["fit", str(tmp_path / "absent.csv")])
    assert missing.exit_code == 1 and "absent.csv: no such file" in missing.output


PRICES = (
    "region,az,instance_type,product,timestamp_utc,spot_price_usd_hr,ondemand_price_usd_hr\n"
    "us-east-1,us-east-1a,m4.large,Linux,2017-01-01 00:00:00,0.03,0.1\n"
    "us-east-1,us-east-1a,m4.large,Linux,2017-01-01 01:00:00,0.04,0.1\n"
)


def test_a_gzipped_price_trace_is_read_whatever_its_name(tmp_path):
    path = tmp_path / "prices.csv"  # gzipped, though its name does not say so
    path.write_bytes(gzip.compress(PRICES.encode()))
    trace = read_trace(path)
    assert trace.vms == (("m4.large", "us-east-1a"),)


@pytest.fixture
def eastern_time(monkeypatch):
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_price_times_without_a_zone_are_utc_whatever_the_local_zone(tmp_path, eastern_time):
    path = tmp_path / "prices.csv"
    path.write_text(PRICES)
    trace = read_trace(path)
    assert trace.times_s[0].tolist() == [1483228800.0, 1483232400.0]  # 2017-01-01 UTC


def test_a_price_trace_without_rows_is_refused(tmp_path):
    path = tmp_path / "prices.csv"
    path.write_text(PRICES.splitlines()[0] + "\n")
    with pytest.raises(TraceError, match=r"prices\.csv: no price rows in the file"):
        read_trace(path)
