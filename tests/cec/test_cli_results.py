"""What `cec run` writes: results with start/end (ISO-8601 UTC for time windows, input positions for count
windows), counts as integers, and dead letters holding the input line exactly as it was read."""

from __future__ import annotations

import csv
from datetime import datetime, timezone
from pathlib import Path

from tests.helpers import cec


def read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def iso(ms: int) -> str:
    moment = datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


BASE_MS = 1_714_564_800_000  # 2024-05-01T12:00:00Z


def _times(tmp_path: Path, style: str) -> Path:
    """The same 300 rows with event times written as integers, or mixing ISO-8601 and SQL style."""
    path = tmp_path / f"{style}.csv"
    lines = ["k,v,ts"]
    for i in range(300):
        ms = BASE_MS + i * 7_250
        if style == "mixed" and i % 3 == 1:
            text = iso(ms)  # 2024-05-01T12:00:07.250Z
        elif style == "mixed" and i % 3 == 2:
            offset = datetime.fromtimestamp(ms / 1000, tz=timezone.utc).astimezone()
            text = offset.isoformat(timespec="milliseconds")  # with the local zone's offset
        elif style == "mixed" and ms % 1000 == 0:
            text = datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
        else:
            text = str(ms)
        lines.append(f"k{i % 4},{i % 10},{text}")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_time_windows_carry_iso_start_and_end_whatever_the_time_format(tmp_path: Path) -> None:
    outs = {}
    for style in ("integers", "mixed"):
        out = cec(
            "run", str(_times(tmp_path, style)), "--key", "k", "--value", "v", "--time", "ts",
            "--window-time", "1 minute", "--agg", "count", "--results", str(tmp_path / f"{style}.out.csv"),
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert "dead letters: 0 rows" in out.stdout
        outs[style] = (tmp_path / f"{style}.out.csv").read_bytes()
    assert outs["mixed"] == outs["integers"]
    rows = read(tmp_path / "integers.out.csv")
    assert list(rows[0]) == ["key", "window", "value", "count", "start", "end"]
    for row in rows:
        start = datetime.strptime(row["start"], "%Y-%m-%dT%H:%M:%S.%f%z")
        end = datetime.strptime(row["end"], "%Y-%m-%dT%H:%M:%S.%f%z")
        assert start.tzinfo == timezone.utc and (end - start).total_seconds() == 60
        assert start.second == 0 and start.microsecond == 0  # aligned to the window
        assert row["count"].isdigit() and row["value"] == row["count"]  # agg=count: integers, not 1.0
    first = next(r for r in rows if r["key"] == "k0")
    assert first["start"] == "2024-05-01T12:00:00.000Z" and first["end"] == "2024-05-01T12:01:00.000Z"


def test_count_windows_carry_the_input_positions_of_their_first_and_last_row(tmp_path: Path) -> None:
    data = tmp_path / "in.csv"
    data.write_text("k,v\n" + "".join(f"k{i % 2},{i}\n" for i in range(12)))
    out = cec("run", str(data), "--key", "k", "--value", "v", "--window-count", "3", "--agg", "sum",
              "--results", str(tmp_path / "out.csv"))  # fmt: skip
    assert out.returncode == 0, out.stderr
    rows = [
        (r["key"], r["window"], r["value"], r["count"], r["start"], r["end"])
        for r in read(tmp_path / "out.csv")
    ]
    # Data row numbers, 0 = the row after the header: k0 has rows 0,2,4 then 6,8,10.
    assert sorted(rows) == [
        ("k0", "0", "6.0", "3", "0", "4"),
        ("k0", "1", "24.0", "3", "6", "10"),
        ("k1", "0", "9.0", "3", "1", "5"),
        ("k1", "1", "27.0", "3", "7", "11"),
    ]


def test_dead_letters_keep_the_input_line_as_it_was_read(tmp_path: Path) -> None:
    data = tmp_path / "in.csv"
    lines = [
        b"k,v,note\r\n",
        b"a,1,plain\r\n",
        b'b,"not, a number",quoted\r\n',
        b'a,2,"two\nlines"\r\n',
        b'c,oops,"two\nlines and bad"\r\n',
        b"\xff\xfe,3,not utf-8 key\r\n",
        b"d,4\r\n",  # too few fields
        b"a,3,ok\r\n",
    ]
    data.write_bytes(b"".join(lines))
    out = cec(
        "run",
        str(data),
        "--key",
        "k",
        "--value",
        "v",
        "--window-count",
        "2",
        "--results",
        str(tmp_path / "out.csv"),
    )
    assert out.returncode == 0, out.stderr
    dead = {int(r["offset"]): r for r in read(tmp_path / "out.dead-letters.csv")}
    assert dead[1]["raw"] == 'b,"not, a number",quoted'
    assert dead[3]["raw"] == 'c,oops,"two\nlines and bad"'
    assert dead[4]["raw"] == "\\xff\\xfe,3,not utf-8 key" and "UTF-8" in dead[4]["reason"]
    assert dead[5]["raw"] == "d,4" and "fields" in dead[5]["reason"]
    assert set(dead) == {1, 3, 4, 5}
