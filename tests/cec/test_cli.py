"""`cec demo` and `cec run` end to end, called as a user calls them (the installed console script)."""

from __future__ import annotations

import csv
import json
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cec.records import Kind
from queuestore.sqlite import SqliteQueueStore
from tests.helpers import cec, child_env, flip_stored_kind, hide_row, log_records


def test_demo_on_spark_by_default_passes_its_own_verdict_with_a_real_kill(tmp_path: Path) -> None:
    out = cec(
        "demo", "--input", "30000", "--keys", "800", "--window", "10", "--quiet", "--store-dir", str(tmp_path)
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "engine: spark, 2 partition(s)" in out.stdout
    assert "SIGKILLed the Python worker of partition 0" in out.stdout
    assert "verdict:               PASS" in out.stdout
    for field in (
        "input tuples:",
        "results (R):",
        "G-open / G-check:",
        "extent at the crash:",
        "EC-load time:",
        "tuples replayed",
        "recovery time:",
    ):
        assert field in out.stdout


def test_local_demo_passes_with_aggressive_checkpointing(tmp_path: Path) -> None:
    out = cec(
        "demo", "--engine", "local", "--input", "30000", "--keys", "800", "--window", "10", "--quiet",
        "--Q", "900", "--U", "1000", "--ci-ms", "10", "--cp-ms", "10", "--store-dir", str(tmp_path),
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SIGKILLed the aggregate process" in out.stdout
    assert "verdict:               PASS" in out.stdout
    g_checks = int(out.stdout.split("G-open / G-check:")[1].split("/")[1].split()[0].replace(",", ""))
    assert g_checks > 0


def test_local_demo_with_a_recovery_target_reports_duty_and_the_target_beside_the_existing_lines(
    tmp_path: Path,
) -> None:
    out = cec(
        "demo", "--engine", "local", "--input", "30000", "--keys", "800", "--window", "10", "--quiet",
        "--recovery-target", "5s", "--store-dir", str(tmp_path),
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "policy: Q=None U=None CI=5.0 ms CP=100.0 ms recovery target=5 s" in out.stdout
    for field in ("extent at the crash:", "EC reconstruction:", "tuples replayed", "recovery time:"):
        assert field in out.stdout
    assert "verdict:               PASS" in out.stdout
    recovery_ms = float(out.stdout.split("recovery time:")[1].split("ms")[0].replace(",", ""))
    duty = float(out.stdout.split("checkpoint duty:")[1].split("%")[0])
    assert 0.0 <= duty <= 50.0
    verdict = "met" if recovery_ms <= 5000 else "MISSED"
    assert f"recovery target:       5000 ms: {verdict} (recovery took {recovery_ms:.1f} ms)" in out.stdout


def _purchases_csv(path: Path, rows: int, seed: int = 7) -> None:
    rng = random.Random(seed)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["item_id", "item_price", "ts", "note"])
        t = 0
        for i in range(rows):
            t += rng.randint(0, 30)
            key, price = f"item-{rng.randint(0, 40)}", str(rng.randint(1, 500))
            if i % 97 == 13:
                price = "n/a"  # not a number
            if i % 131 == 5:
                key = ""  # missing key
            w.writerow([key, price, t, "x"])


@pytest.mark.parametrize(
    "window", [["--window-count", "5"], ["--time", "ts", "--window-time", "200ms"]], ids=["count", "time"]
)
def test_run_with_crash_after_k_is_byte_identical(tmp_path: Path, window: list[str]) -> None:
    data = tmp_path / "purchases.csv"
    _purchases_csv(data, 3000)
    base = ["run", str(data), "--key", "item_id", "--value", "item_price", *window, "--agg", "avg"]
    ok = cec(*base, "--results", str(tmp_path / "plain.csv"))
    assert ok.returncode == 0, ok.stderr
    plain = (tmp_path / "plain.csv").read_bytes()
    plain_dead = (tmp_path / "plain.dead-letters.csv").read_bytes()
    rows = list(csv.DictReader((tmp_path / "plain.csv").open()))
    assert rows and list(rows[0]) == ["key", "window", "value", "count", "start", "end"]
    dead = list(csv.DictReader((tmp_path / "plain.dead-letters.csv").open()))
    assert len(dead) >= 3000 // 131 + 3000 // 97 - 2
    assert f"dead letters: {len(dead):,} rows" in ok.stdout

    budgeted = cec(*base, "--results", str(tmp_path / "budget.csv"), "--U", "200", "--ci-ms", "20",
                   "--cp-ms", "100", "--policy", "cost-benefit")  # fmt: skip
    assert budgeted.returncode == 0, budgeted.stderr
    assert (tmp_path / "budget.csv").read_bytes() == plain
    assert "checkpoint duty:" in budgeted.stdout and "targets in force:      Q=None U=200" in budgeted.stdout

    for k in (1, 14, 1500, 2999):
        out = cec(*base, "--results", str(tmp_path / f"crash{k}.csv"), "--crash-after", str(k), "--Q", "30")
        assert out.returncode == 0, out.stderr
        assert f"SIGKILLed after {k:,} input rows" in out.stdout
        assert (tmp_path / f"crash{k}.csv").read_bytes() == plain, f"--crash-after {k}"
        assert (tmp_path / f"crash{k}.dead-letters.csv").read_bytes() == plain_dead, f"--crash-after {k}"


def test_run_resumes_from_its_store_dir_after_being_killed(tmp_path: Path) -> None:
    """A user's `cec run --store-dir` killed from outside resumes where the log ends when run again."""
    data = tmp_path / "in.csv"
    _purchases_csv(data, 20000)
    args = [
        "run",
        str(data),
        "--key",
        "item_id",
        "--value",
        "item_price",
        "--window-count",
        "3",
        "--results",
        str(tmp_path / "out.csv"),
    ]
    assert cec(*args).returncode == 0
    want = (tmp_path / "out.csv").read_bytes()
    (tmp_path / "out.csv").unlink()
    store = tmp_path / "store"
    script = Path(sys.executable).parent / "cec"
    proc = subprocess.Popen(
        [str(script), *args, "--store-dir", str(store)],
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    from tests.helpers import wait_for

    wait_for(lambda: proc.poll() is not None or any(store.glob("*/0.sqlite-wal")), timeout=60)
    proc.kill()
    proc.communicate()
    again = cec(*args, "--store-dir", str(store))
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "out.csv").read_bytes() == want


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--key", "nope", "--value", "item_price", "--window-count", "3"], "has no column 'nope'"),
        (["--key", "item_id", "--value", "item_price", "--window-time", "1s"], "--window-time needs --time"),
        (
            ["--key", "item_id", "--value", "item_price", "--time", "ts", "--window-time", "soon"],
            "not a duration",
        ),
    ],
)
def test_run_rejects_bad_arguments_clearly(tmp_path: Path, args: list[str], message: str) -> None:
    data = tmp_path / "in.csv"
    _purchases_csv(data, 10)
    out = cec("run", str(data), *args, "--results", str(tmp_path / "out.csv"))
    assert out.returncode == 2
    assert message in out.stderr and "Traceback" not in out.stderr


def test_missing_input_file_is_a_clear_error(tmp_path: Path) -> None:
    out = cec(
        "run",
        str(tmp_path / "nope.csv"),
        "--key",
        "a",
        "--value",
        "b",
        "--window-count",
        "2",
        "--results",
        str(tmp_path / "o.csv"),
    )
    assert out.returncode == 2 and "input file not found" in out.stderr


def test_inspect_shows_the_eventual_checkpoint(tmp_path: Path) -> None:
    data = tmp_path / "in.csv"
    _purchases_csv(data, 500)
    store = tmp_path / "store"
    out = cec(
        "run",
        str(data),
        "--key",
        "item_id",
        "--value",
        "item_price",
        "--window-count",
        "4",
        "--results",
        str(tmp_path / "o.csv"),
        "--store-dir",
        str(store),
        "--Q",
        "20",
    )
    assert out.returncode == 0
    topic = next(p.name for p in store.iterdir() if p.is_dir() and p.name.startswith("run-"))
    shown = cec("inspect", topic, "--store-dir", str(store))
    assert shown.returncode == 0, shown.stderr
    assert "finished (EOS)" in shown.stdout and "eventual checkpoint:" in shown.stdout
    unknown = cec("inspect", "no-such-topic", "--store-dir", str(store))
    assert unknown.returncode == 2 and "no topic 'no-such-topic'" in unknown.stderr


def test_demo_against_kafka_recovers_exactly(tmp_path: Path, kafka_broker: object) -> None:
    """`cec demo --bootstrap-servers`: the queues on a Kafka-protocol broker, a real kill, exact output."""
    bootstrap = kafka_broker.bootstrap  # type: ignore[attr-defined]
    out = cec("demo", "--engine", "local", "--input", "20000", "--keys", "500", "--quiet",
              "--bootstrap-servers", bootstrap, "--store-dir", str(tmp_path))  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"queue store: kafka ({bootstrap})" in out.stdout
    assert "SIGKILLed the aggregate process" in out.stdout
    assert "verdict:               PASS" in out.stdout


# -- input identity: a log resumes only against the input it was built from ----------------------------
def _edit_same_size(path: Path) -> None:
    """Change one price digit in place: same size, different content (what a path+size check misses)."""
    data = bytearray(path.read_bytes())
    lines = data.split(b"\n")
    fields = lines[5].split(b",")
    fields[1] = b"1" if fields[1][:1] != b"1" else b"2"
    fields[1] = fields[1] + b"0" * (len(lines[5].split(b",")[1]) - 1)
    lines[5] = b",".join(fields)
    edited = b"\n".join(lines)
    assert len(edited) == len(data) and edited != data
    path.write_bytes(edited)


def _assert_refused(out: subprocess.CompletedProcess[str], store: str) -> None:
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("cec: error: run-") and "was built from another input" in lines[0]
    assert f"in {store} " in lines[0] and "use a new --store-dir" in lines[0]


def _run_args(data: Path, results: Path, *extra: str) -> list[str]:
    return ["run", str(data), "--key", "item_id", "--value", "item_price", "--window-count", "3",
            "--results", str(results), *extra]  # fmt: skip


def _kill_once_logged(args: list[str], store: Path, signum: int = signal.SIGKILL, records: int = 1) -> str:
    """Start `cec run`, send it `signum` (SIGKILL) as soon as its log has `records` durable records (a log
    that is empty belongs to no input yet, so the kill must come after one), and check it was stopped
    before it finished; its stderr."""
    from queuestore.sqlite import SqliteQueueStore
    from tests.helpers import wait_for

    script = Path(sys.executable).parent / "cec"
    proc = subprocess.Popen(
        [str(script), *args], env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )

    def logged() -> int:
        try:
            (topic,) = json.loads((store / "cec-run-topics.json").read_text()).values()
            sqlite = SqliteQueueStore(store)
            if not sqlite.topic_exists(topic):
                return 0
            with sqlite.reader(topic, 0) as reader:
                return reader.end_offset()
        except FileNotFoundError:
            return 0

    try:
        wait_for(lambda: proc.poll() is not None or logged() >= records, timeout=60)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    want = -signal.SIGKILL if signum == signal.SIGKILL else 128 + signum
    assert proc.returncode == want, f"the run ended before it could be stopped: {err}"
    return err


@pytest.mark.parametrize("trimmed", [False, True], ids=["untrimmed", "trimmed"])
def test_a_csv_run_stopped_by_sigterm_says_so_and_a_rerun_completes_it(tmp_path: Path, trimmed: bool) -> None:
    data, results, store = tmp_path / "in.csv", tmp_path / "out.csv", tmp_path / "store"
    _purchases_csv(data, 60_000)
    extra = ["--trim-every", "1000"] if trimmed else []
    assert cec(*_run_args(data, tmp_path / "ref.csv")).returncode == 0
    args = _run_args(data, results, "--store-dir", str(store), *extra)
    err = _kill_once_logged(args, store, signal.SIGTERM, records=500)
    partial = Path(f"{results}.partial")
    written = (
        f"the results so far are in {partial} (incomplete)" if trimmed else "no results file was written"
    )
    assert err == (
        f"cec: stopped by SIGTERM before the end of the input: {written}; run the same command again to "
        "resume from its log\n"
    )
    assert not results.exists() and partial.exists() == trimmed
    again = cec(*args)
    assert again.returncode == 0, again.stderr
    assert not partial.exists()
    if trimmed:  # written as the run went: rows in log order, the same rows
        assert sorted(results.read_text().splitlines()) == sorted(
            (tmp_path / "ref.csv").read_text().splitlines()
        )
    else:
        assert results.read_bytes() == (tmp_path / "ref.csv").read_bytes()


@pytest.mark.parametrize("first", ["completed", "crash-after", "killed"])
def test_an_input_edited_in_place_is_refused_not_rerun_to_old_results(tmp_path: Path, first: str) -> None:
    data = tmp_path / "in.csv"
    _purchases_csv(data, 2000 if first != "killed" else 40000)
    store = tmp_path / "store"
    args = _run_args(data, tmp_path / "out.csv", "--store-dir", str(store))
    if first == "completed":
        assert cec(*args).returncode == 0
    elif first == "crash-after":
        assert cec(*args, "--crash-after", "700").returncode == 0
    else:  # SIGKILLed from outside once its log holds records: a log without EOS, resumed by the next run
        _kill_once_logged(args, store)
    _edit_same_size(data)
    _assert_refused(cec(*args), str(store))
    _assert_refused(cec(*args, "--crash-after", "100"), str(store))
    # A new store dir starts fresh, and gets the edited file's results.
    fresh = cec(*_run_args(data, tmp_path / "fresh.csv", "--store-dir", str(tmp_path / "new")))
    reference = cec(*_run_args(data, tmp_path / "reference.csv"))
    assert fresh.returncode == 0 and reference.returncode == 0
    assert (tmp_path / "fresh.csv").read_bytes() == (tmp_path / "reference.csv").read_bytes()


def test_on_kafka_an_edited_input_never_reuses_the_old_log(tmp_path: Path, kafka_broker: object) -> None:
    """Topics outlive store dirs: with a fresh --store-dir the edited file gets its own topic (named after
    its content) and its own results; with the same --store-dir the old log refuses it."""
    bootstrap = kafka_broker.bootstrap  # type: ignore[attr-defined]
    data = tmp_path / "in.csv"
    _purchases_csv(data, 1500, seed=11)
    kafka = ["--bootstrap-servers", bootstrap]
    first = cec(*_run_args(data, tmp_path / "old.csv", "--store-dir", str(tmp_path / "s1"), *kafka))
    assert first.returncode == 0, first.stderr
    _edit_same_size(data)
    _assert_refused(cec(*_run_args(data, tmp_path / "x.csv", "--store-dir", str(tmp_path / "s1"), *kafka)),
                    f"Kafka at {bootstrap}")  # fmt: skip
    fresh = cec(*_run_args(data, tmp_path / "new.csv", "--store-dir", str(tmp_path / "s2"), *kafka))
    assert fresh.returncode == 0, fresh.stderr
    assert cec(*_run_args(data, tmp_path / "reference.csv")).returncode == 0
    assert (tmp_path / "new.csv").read_bytes() == (tmp_path / "reference.csv").read_bytes()
    assert (tmp_path / "new.csv").read_bytes() != (tmp_path / "old.csv").read_bytes()  # the edit shows


# -- poison input: dead letters with reasons, the run goes on ---------------------------------------------
_NOT_A_TIME = "time 'ts' is neither integer milliseconds nor"
_POISON = [
    # (key, value, ts, expected reason, poison for which windows)
    (b"item-1", b"5", b"1e30", "time 'ts' is out of range", {"time", "count"}),
    (b"item-2", b"5", b"9.3e18", "time 'ts' is out of range", {"time", "count"}),
    (b"item-3", b"5", b"9223372036854775807", "beyond the 64-bit range less the window", {"time"}),
    (b"item-4", b"5", b"nan", "time 'ts' is not finite", {"time", "count"}),
    (b"item-5", b"5", b"inf", "time 'ts' is not finite", {"time", "count"}),
    (b"item-6", b"1e400", b"TS", "value 'item_price' is not finite", {"time", "count"}),
    (b"item-7", b"-inf", b"TS", "value 'item_price' is not finite", {"time", "count"}),
    (b"\xfe", b"7", b"TS", "key 'item_id' is not valid UTF-8: b'\\xfe'", {"time", "count"}),
    (b"\xff", b"9", b"TS", "key 'item_id' is not valid UTF-8: b'\\xff'", {"time", "count"}),
    (b"item-\xfe1", b"9", b"TS", "key 'item_id' is not valid UTF-8: b'item-\\xfe1'", {"time", "count"}),
    # What Python's float() / int() read but a number written as text is not: ASCII decimal only.
    (b"item-8", b"1_000", b"TS", "value 'item_price' is not a number", {"time", "count"}),
    (b"item-9", b" 12 ", b"TS", "value 'item_price' is not a number", {"time", "count"}),
    (b"item-10", "\u0661\u0662".encode(), b"TS", "value 'item_price' is not a number", {"time", "count"}),
    (b"item-11", b"5", b"TS_", _NOT_A_TIME, {"time", "count"}),
    (b"item-12", b"5", b" TS ", _NOT_A_TIME, {"time", "count"}),
    (b"item-13", b"5", "\u0661\u0662".encode(), _NOT_A_TIME, {"time", "count"}),
    (b"item-14", b"5", b"TS.5", _NOT_A_TIME, {"time", "count"}),  # a fraction
]


def _poisoned_csv(path: Path, clean: Path, windows: str, rows: int = 1500) -> dict[int, str]:
    """`path`: good rows with poison rows among them; `clean`: the same good rows only. Returns the
    poison rows' offsets (data row numbers in `path`) and the reason each must be dead-lettered with."""
    rng = random.Random(3)
    poisoned, good, expected = [b"item_id,item_price,ts"], [b"item_id,item_price,ts"], {}
    t = 0
    for i in range(rows):
        t += rng.randint(0, 30)
        row = b"item-%d,%d,%d" % (rng.randint(0, 30), rng.randint(1, 500), t)
        poisoned.append(row)
        good.append(row)
        if i % 23 == 5:  # every poison kind, several times over (three times at least)
            key, value, ts, reason, kinds = _POISON[(i // 23) % len(_POISON)]
            row = b",".join([key, value, ts.replace(b"TS_", b"1_%d" % t).replace(b"TS", b"%d" % t)])
            poisoned.append(row)
            if windows in kinds:
                expected[len(poisoned) - 2] = reason
            else:
                good.append(row)
    path.write_bytes(b"\n".join(poisoned) + b"\n")
    clean.write_bytes(b"\n".join(good) + b"\n")
    return expected


@pytest.mark.parametrize(
    "window", [["--time", "ts", "--window-time", "200ms"], ["--time", "ts", "--window-count", "3"]],
    ids=["time", "count"],
)  # fmt: skip
def test_poison_rows_are_dead_letters_and_good_rows_stay_exact(tmp_path: Path, window: list[str]) -> None:
    data, clean = tmp_path / "in-poisoned.csv", tmp_path / "in-clean.csv"
    expected = _poisoned_csv(data, clean, "time" if "--window-time" in window else "count")
    assert len(expected) >= 3 * len(_POISON) - 3

    def run(path: Path, name: str, *extra: str) -> subprocess.CompletedProcess[str]:
        base = ["run", str(path), "--key", "item_id", "--value", "item_price", *window, "--agg", "sum"]
        out = cec(*base, "--results", str(tmp_path / f"{name}.csv"), *extra)
        assert out.returncode == 0 and "Traceback" not in out.stderr, out.stdout + out.stderr
        return out

    run(clean, "clean")
    run(data, "poisoned")
    # Good rows exact: the same results as a run over the file without the poison rows.
    assert (tmp_path / "poisoned.csv").read_bytes() == (tmp_path / "clean.csv").read_bytes()
    dead_rows = csv.DictReader((tmp_path / "poisoned.dead-letters.csv").open())
    dead = {int(r["offset"]): r["reason"] for r in dead_rows}
    for offset, reason in expected.items():
        assert reason in dead.get(offset, ""), (offset, dead.get(offset))
    clean_dead = list(csv.DictReader((tmp_path / "clean.dead-letters.csv").open()))
    assert len(dead) == len(expected) + len(clean_dead)
    # Undecodable keys were never merged into one window, nor with any other key.
    results_keys = {r["key"] for r in csv.DictReader((tmp_path / "poisoned.csv").open(encoding="utf-8"))}
    assert all(k.startswith("item-") and "\ufffd" not in k for k in results_keys)

    # A crash anywhere, including right at a poison row, recovers to the same bytes (no crash loop).
    first_poison = min(expected)
    for k in (first_poison, first_poison + 1, 700):
        run(data, f"crash{k}", "--crash-after", str(k), "--Q", "20")
        assert (tmp_path / f"crash{k}.csv").read_bytes() == (tmp_path / "poisoned.csv").read_bytes(), k
        assert (tmp_path / f"crash{k}.dead-letters.csv").read_bytes() == (
            tmp_path / "poisoned.dead-letters.csv"
        ).read_bytes(), k


@pytest.mark.parametrize(
    ("bom", "at"), [(False, 3), (True, 3), (False, 40)], ids=["field-in-first-rows", "bom", "field-later"]
)
def test_a_byte_order_mark_and_an_oversized_field_anywhere_read_the_same(
    tmp_path: Path, bom: bool, at: int
) -> None:
    """A leading UTF-8 byte order mark (as spreadsheets write) is not part of the first column's name; a
    row with a field over the CSV reader's 128 KiB limit is a dead letter wherever it is, the first rows
    (looked at before the run) included."""
    rows = [b"item-%d,%d,%d" % (i % 7, i, i) for i in range(60)]
    header = b"item_id,item_price,ts"
    big = b"item-1," + b"9" * (200 * 1024) + b",5"
    clean, data = tmp_path / "clean.csv", tmp_path / "in.csv"
    clean.write_bytes(b"\n".join([header, *rows]) + b"\n")
    data.write_bytes(
        (b"\xef\xbb\xbf" if bom else b"") + b"\n".join([header, *rows[:at], big, *rows[at:]]) + b"\n"
    )
    base = ["--key", "item_id", "--value", "item_price", "--window-count", "3", "--agg", "sum"]
    want = cec("run", str(clean), *base, "--results", str(tmp_path / "want.csv"))
    got = cec("run", str(data), *base, "--results", str(tmp_path / "got.csv"))
    assert want.returncode == 0 and got.returncode == 0, got.stdout + got.stderr

    # Offsets (count windows' start/end) shift by the one extra row after it: compare the windows' values.
    def values(path: Path) -> list[tuple[str, str, str, str]]:
        return [(r["key"], r["window"], r["value"], r["count"]) for r in csv.DictReader(path.open())]

    assert values(tmp_path / "got.csv") == values(tmp_path / "want.csv")
    limit = csv.field_size_limit(1 << 20)  # the dead letter keeps the 200 KiB line as it was read
    try:
        dead = list(csv.DictReader((tmp_path / "got.dead-letters.csv").open()))
    finally:
        csv.field_size_limit(limit)
    assert [d["raw"] for d in dead] == [big.decode()]
    assert [(d["offset"], d["reason"]) for d in dead] == [
        (str(at), "unreadable CSV row: field larger than field limit (131072)")
    ]


def _run_in_store_args(data: Path, results: Path, store: Path) -> list[str]:
    return ["run", str(data), "--key", "item_id", "--value", "item_price", "--window-count", "4",
            "--results", str(results), "--store-dir", str(store)]  # fmt: skip


def _one_line_error(out: subprocess.CompletedProcess[str], *parts: str) -> None:
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith("cec: error: ")
    for part in parts:
        assert part in out.stderr, out.stderr


def _finished_run(tmp_path: Path) -> tuple[Path, Path, str, list[int]]:
    """A finished `cec run --store-dir`: input, store, topic and the offsets of its results."""
    data, store = tmp_path / "in.csv", tmp_path / "store"
    _purchases_csv(data, 3000)
    out = cec(*_run_in_store_args(data, tmp_path / "first.csv", store))
    assert out.returncode == 0, out.stderr
    topic = next(p.name for p in store.iterdir() if p.is_dir() and p.name.startswith("run-"))
    records = log_records(SqliteQueueStore(store), topic)
    return data, store, topic, [i for i, r in enumerate(records) if r.kind is Kind.R]


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_a_result_whose_stored_kind_is_flipped_is_a_clear_error(tmp_path: Path, where: str) -> None:
    """R -> Q in the kind kept beside a result: before, `cec run` and `cec inspect` dropped that result
    silently (exit 0); now both name the damaged record and exit non-zero."""
    data, store, topic, r_offsets = _finished_run(tmp_path)
    offset = {"first": r_offsets[0], "middle": r_offsets[len(r_offsets) // 2], "last": r_offsets[-1]}[where]
    assert flip_stored_kind(store, topic, offset) == "Q"
    again = cec(*_run_in_store_args(data, tmp_path / "again.csv", store))
    _one_line_error(again, f"{topic}[0] offset {offset}", "damaged")
    assert not (tmp_path / "again.csv").exists()  # no results file from a damaged log
    shown = cec("inspect", topic, "--store-dir", str(store))
    _one_line_error(shown, f"{topic}[0] offset {offset}", "damaged")


def test_a_hidden_row_is_a_clear_error_naming_the_offset(tmp_path: Path) -> None:
    data, store, topic, r_offsets = _finished_run(tmp_path)
    offset = r_offsets[len(r_offsets) // 3]
    hide_row(store, topic, offset)
    again = cec(*_run_in_store_args(data, tmp_path / "again.csv", store))
    _one_line_error(again, f"{store}/{topic}/0.sqlite: {topic}[0] offset {offset} is missing")
    assert not (tmp_path / "again.csv").exists()
    shown = cec("inspect", topic, "--store-dir", str(store))
    _one_line_error(shown, f"{store}/{topic}/0.sqlite: {topic}[0] offset {offset} is missing")


def test_a_failed_append_stops_the_run_and_a_rerun_recovers_exactly(tmp_path: Path) -> None:
    """A disk error in the store's 3rd write batch: `cec run` stops with one line, the log it leaves has
    no hole, and running it again resumes to byte-identical results."""
    data = tmp_path / "in.csv"
    _purchases_csv(data, 20000)
    plain = cec(*_run_in_store_args(data, tmp_path / "plain.csv", tmp_path / "plain-store"))
    assert plain.returncode == 0, plain.stderr
    store = tmp_path / "store"
    failed = cec(*_run_in_store_args(data, tmp_path / "out.csv", store), faults="store.io_error:3")
    _one_line_error(failed, "failed (disk I/O error)", "restart the operator")
    assert not (tmp_path / "out.csv").exists()
    topic = next(p.name for p in store.iterdir() if p.is_dir() and p.name.startswith("run-"))
    kinds = [r.kind for r in log_records(SqliteQueueStore(store), topic)]  # a dense scan: no hole
    assert Kind.EOS not in kinds
    again = cec(*_run_in_store_args(data, tmp_path / "out.csv", store))
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "out.csv").read_bytes() == (tmp_path / "plain.csv").read_bytes()
    assert (tmp_path / "out.dead-letters.csv").read_bytes() == (
        tmp_path / "plain.dead-letters.csv"
    ).read_bytes()


@pytest.mark.parametrize("windows", ["hopping", "session"])
def test_the_local_demo_over_hopping_and_session_windows_passes_with_a_real_kill(
    tmp_path: Path, windows: str
) -> None:
    out = cec(
        "demo", "--engine", "local", "--windows", windows, "--input", "30000", "--keys", "400", "--window", "10",
        "--quiet", "--store-dir", str(tmp_path),
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    over = {
        "hopping": "hopping windows of 4000 ms sliding by 1000 ms",
        "session": "sessions with a gap of 400 ms",
    }
    assert f"avg(price) per item over {over[windows]}" in out.stdout
    assert "SIGKILLed the aggregate process" in out.stdout
    assert "verdict:               PASS" in out.stdout
    results = int(out.stdout.split("results (R):")[1].split("(")[0].replace(",", ""))
    assert results > 1000
