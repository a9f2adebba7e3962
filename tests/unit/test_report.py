"""Tests of the AFL++-compatible reports, checked with the real afl-whatsup and afl-plot."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from symcc_mpi.campaign.afl_names import AFL_SYNC_MAX_ID, afl_queue_name, parse_afl_queue_id
from symcc_mpi.campaign.report import (
    PLOT_HEADER,
    CampaignSnapshot,
    ReportWriter,
    format_fuzzer_stats,
    format_plot_row,
)
from symcc_mpi.job.live import render_live, summary_table

AFL_FUZZ = shutil.which("afl-fuzz")
WHATSUP = shutil.which("afl-whatsup")
AFL_PLOT = shutil.which("afl-plot")
GNUPLOT = shutil.which("gnuplot")

# afl-fuzz 4.04c's fuzzer_stats keys, in its order.
AFL_404C_KEYS = """start_time last_update run_time fuzzer_pid cycles_done cycles_wo_finds execs_done
execs_per_sec execs_ps_last_min corpus_count corpus_favored corpus_found corpus_imported
corpus_variable max_depth cur_item pending_favs pending_total stability bitmap_cvg saved_crashes
saved_hangs last_find last_crash last_hang execs_since_crash exec_timeout slowest_exec_ms
peak_rss_mb cpu_affinity edges_found total_edges var_byte_count havoc_expansion auto_dict_entries
testcache_size testcache_count testcache_evict afl_banner afl_version target_mode
command_line""".split()

T0 = 1_700_000_000.0


def snapshot(**overrides) -> CampaignSnapshot:
    figures = dict(
        start_time=T0,
        now=T0 + 600,
        executions=120_000,
        generated=6_000_000,
        unique=2_000_000,
        interesting=35,
        corpus_count=40,
        pending=77,
        max_depth=4,
        crashes=2,
        hangs=1,
        crashing_runs=9,
        hanging_runs=3,
        execs_at_last_crash=100_000,
        last_find=T0 + 588,
        last_crash=T0 + 300,
        executor_time=1150.0,
        solver_time=900.0,
        edges_found=345,
        map_size=20_000,
        timeout_ms=1000,
        workers=2,
        per_worker={1: {"executions": 60_000, "generated": 3_000_000}, 2: {"executions": 60_000}},
        command_line="symcc-mpi explore --target ./parser @@",
        banner="unit",
    )
    figures.update(overrides)
    return CampaignSnapshot(**figures)


def parse_stats(text: str) -> dict[str, str]:
    return {k.strip(): v for k, v in (line.split(" : ", 1) for line in text.splitlines())}


# --------------------------------------------------------------------------- formats


def test_fuzzer_stats_has_afl_404c_keys_and_formats():
    text = format_fuzzer_stats(snapshot(), fuzzer_pid=4242, afl_version="x")
    lines = text.splitlines()
    assert [line.split(":")[0].strip() for line in lines] == AFL_404C_KEYS
    assert all(re.fullmatch(r"[a-z_]{1,18} *: .*", line) and line[18:20] == ": " for line in lines)
    stats = parse_stats(text)
    assert stats["fuzzer_pid"] == "4242" and stats["run_time"] == "600"
    assert stats["start_time"] == str(int(T0)) and stats["last_update"] == str(int(T0) + 600)
    assert stats["execs_per_sec"] == "200.00"
    assert stats["bitmap_cvg"] == "1.73%" and stats["stability"] == "100.00%"
    assert stats["execs_since_crash"] == "20000" and stats["last_hang"] == "0"
    assert stats["corpus_found"] == "35" and stats["pending_total"] == "77"
    assert stats["command_line"] == "symcc-mpi explore --target ./parser @@"


def test_legacy_keys_for_old_afl_whatsup():
    stats = parse_stats(format_fuzzer_stats(snapshot(), fuzzer_pid=1, legacy_keys=True))
    assert stats["paths_total"] == "40" and stats["unique_crashes"] == "2"
    assert stats["cur_path"] == "0" and stats["last_path"] == str(int(T0) + 588)
    assert list(stats)[-4:] == ["afl_banner", "afl_version", "target_mode", "command_line"]


def _c_string_at(binary: bytes, marker: bytes) -> str:
    start = binary.find(marker)
    assert start >= 0, marker
    return binary[start : binary.index(b"\0", start)].decode()


@pytest.mark.skipif(AFL_FUZZ is None, reason="afl-fuzz not installed (Debian package afl++)")
def test_formats_match_the_installed_afl_fuzz():
    binary = Path(AFL_FUZZ).read_bytes()
    stats_format = _c_string_at(binary, b"start_time        : %llu\n")
    afl_keys = [line.split(":")[0].strip() for line in stats_format.splitlines()]
    ours = format_fuzzer_stats(snapshot(), fuzzer_pid=1).splitlines()
    assert [line.split(":")[0].strip() for line in ours] == afl_keys
    assert _c_string_at(binary, b"# relative_time,") == PLOT_HEADER
    row_format = _c_string_at(binary, b"%llu, %llu, %u, %u, %u, %u, %0.02f%%")
    regex = {"%llu": r"\d+", "%u": r"\d+", "%0.02f": r"\d+\.\d\d", "%%": "%"}
    pieces = re.split(r"(%llu|%u|%0\.02f|%%)", row_format)
    pattern = "".join(regex.get(piece, re.escape(piece)) for piece in pieces)
    assert re.fullmatch(pattern, format_plot_row(snapshot()))


def test_values_are_safe_for_afl_whatsup_to_source(tmp_path):
    marker = tmp_path / "pwned"
    banner = f'a "b" $(touch {marker}) `touch {marker}` \\ c\nd'
    text = format_fuzzer_stats(
        snapshot(banner=banner, command_line=f"x $(touch {marker})\ny"), fuzzer_pid=1
    )
    stats_file = tmp_path / "fuzzer_stats"
    stats_file.write_text(text)
    sourced = tmp_path / "sourced"
    # afl-whatsup's own transformation, then sourced by sh as the script does.
    sed = r's/^command_line.*$/_skip:1/;s/[ ]*:[ ]*/="/;s/$/"/'
    subprocess.run(["sed", sed, str(stats_file)], stdout=sourced.open("w"), check=True)
    out = subprocess.run(
        ["sh", "-c", f'. "{sourced}"; printf %s "$afl_banner|$saved_crashes"'],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.endswith("|2") and "touch" in out.stdout
    assert not marker.exists()
    assert len(text.splitlines()) == len(AFL_404C_KEYS)


def test_plot_row_format():
    row = format_plot_row(snapshot(), execs_per_sec=12.5)
    assert row == "600, 0, 0, 40, 77, 0, 1.73%, 2, 1, 4, 12.50, 120000, 345\n"
    assert PLOT_HEADER.count(",") == row.count(",") == 12


# --------------------------------------------------------------------------- the writer


def test_writer_files_and_plot_interval(tmp_path):
    writer = ReportWriter(tmp_path / "out", plot_interval=10, fuzzer_pid=77)
    for k in range(6):
        writer.write(snapshot(now=T0 + 4 * k, executions=1000 * (k + 1)))
    lines = writer.plot_path.read_text().splitlines(keepends=True)
    assert lines[0] == PLOT_HEADER
    assert [int(line.split(",")[0]) for line in lines[1:]] == [0, 12]
    last = snapshot(now=T0 + 21, executions=7000)
    writer.close(last)
    writer.close(last)  # a repeated final row is not appended twice
    rows = writer.plot_path.read_text().splitlines()[1:]
    assert [int(r.split(",")[0]) for r in rows] == [0, 12, 21]
    assert rows[-1].split(", ")[10] == "1000.00"  # speed since the previous write
    stats = parse_stats(writer.fuzzer_stats_path.read_text())
    assert stats["fuzzer_pid"] == "77" and stats["execs_done"] == "7000"
    assert stats["execs_ps_last_min"] == "1000.00"
    document = json.loads(writer.stats_path.read_text())
    assert document["format"] == "symcc-mpi-stats/1"
    assert document["executions"] == 7000 and document["per_worker"]["1"]["executions"] == 60_000
    assert document["solver_share"] == pytest.approx(900 / 1150)
    assert document["unique_ratio"] == pytest.approx(1 / 3)
    assert sorted(p.name for p in writer.out_dir.iterdir()) == [
        "fuzzer_stats",
        "plot_data",
        "stats.json",
    ]


def test_no_fuzzer_stats_before_the_first_execution(tmp_path):
    writer = ReportWriter(tmp_path / "out")
    writer.write(snapshot(executions=0, corpus_count=0, now=T0))
    assert writer.stats_path.exists() and not writer.fuzzer_stats_path.exists()
    writer.write(snapshot(executions=5, corpus_count=0, now=T0 + 1))
    assert not writer.fuzzer_stats_path.exists()
    writer.write(snapshot(executions=5, corpus_count=1, now=T0 + 2))
    assert writer.fuzzer_stats_path.exists()


def test_writer_resumes_plot_data(tmp_path):
    out = tmp_path / "out"
    ReportWriter(out).close(snapshot(now=T0 + 10))
    with open(out / "plot_data", "a") as f:
        f.write("20, 0, 0, 4")  # a row cut short by a crash
    ReportWriter(out).close(snapshot(now=T0 + 30))
    lines = (out / "plot_data").read_text().splitlines()
    assert lines[0] == PLOT_HEADER.strip() and lines.count(PLOT_HEADER.strip()) == 1
    assert [int(line.split(",")[0]) for line in lines[1:]] == [10, 30]


def test_writer_keeps_a_foreign_plot_data(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "plot_data").write_text("# unix_time, something else\n1, 2\n")
    ReportWriter(out).close(snapshot())
    assert (out / "plot_data.orig").read_text().startswith("# unix_time")
    assert (out / "plot_data").read_text().startswith(PLOT_HEADER)


def _tool_env() -> dict[str, str]:
    return {**os.environ, "TERM": "dumb"}


def _env_at(now: float, tmp_path: Path) -> dict[str, str]:
    """_tool_env with `date +%s`, afl-whatsup's only clock, reading `now`: the test sets both
    ends of every duration afl-whatsup prints, instead of racing the seconds."""
    frozen = tmp_path / "frozen-date"
    frozen.mkdir()
    (frozen / "date").write_text(f'#!/bin/sh\n[ "$*" = "+%s" ] && exec echo {int(now)}\n'
                                 f'exec {shutil.which("date")} "$@"\n')
    (frozen / "date").chmod(0o755)
    return {**_tool_env(), "PATH": f"{frozen}{os.pathsep}{os.environ['PATH']}"}


@pytest.mark.skipif(WHATSUP is None, reason="afl-whatsup not installed (Debian package afl++)")
def test_afl_whatsup_reads_a_live_campaign(tmp_path):
    sync, now = tmp_path / "sync", T0 + 600
    ReportWriter(sync / "symcc", fuzzer_pid=os.getpid()).write(
        snapshot(now=now, start_time=now - 600, last_find=now - 12, last_crash=None)
    )
    # A campaign that has not run anything yet must not upset the summary.
    ReportWriter(sync / "starting", fuzzer_pid=os.getpid()).write(snapshot(executions=0))
    run = subprocess.run([WHATSUP, str(sync)], capture_output=True, text=True,
                         env=_env_at(now, tmp_path))
    assert run.returncode == 0, run.stderr
    assert "division" not in run.stderr
    out = run.stdout
    assert f">>> unit (0 days, 0 hrs) fuzzer PID: {os.getpid()} <<<" in out
    assert "Fuzzers alive : 1" in out
    assert "lifetime speed 200 execs/sec" in out
    assert "pending 0/77, coverage 1.73%, crashes saved 2 (!)" in out
    assert "last_find       : 12 seconds" in out
    assert "Total execs : 120 thousands" in out and "Crashes saved : 2" in out
    assert "Total run time : 10 minutes" in out


@pytest.mark.skipif(WHATSUP is None, reason="afl-whatsup not installed (Debian package afl++)")
def test_afl_whatsup_sees_a_finished_campaign_as_dead(tmp_path):
    gone = subprocess.Popen(["true"])
    gone.wait()
    ReportWriter(tmp_path / "sync" / "symcc", fuzzer_pid=gone.pid).write(snapshot())
    sync = str(tmp_path / "sync")
    run = subprocess.run([WHATSUP, sync], capture_output=True, text=True, env=_tool_env())
    assert run.returncode == 0 and "Dead or remote : 1" in run.stdout
    run = subprocess.run(
        [WHATSUP, "-s", "-d", sync], capture_output=True, text=True, env=_tool_env()
    )
    assert "Total execs : 120 thousands" in run.stdout and "Crashes saved : 2" in run.stdout


@pytest.mark.skipif(
    AFL_PLOT is None or GNUPLOT is None,
    reason="afl-plot (Debian afl++) or gnuplot (Debian gnuplot-nox) not installed",
)
def test_afl_plot_draws_the_campaign(tmp_path):
    writer = ReportWriter(tmp_path / "out", plot_interval=60)
    for k in range(30):
        writer.write(
            snapshot(
                now=T0 + 60 * k,
                executions=9000 * k + 1,
                corpus_count=5 + 3 * k,
                pending=200 - 5 * k,
                edges_found=40 * k,
                crashes=k // 10,
                max_depth=1 + k // 5,
            )
        )
    writer.close(snapshot(now=T0 + 1800, executions=270_001, edges_found=1200))
    plots = tmp_path / "plots"
    run = subprocess.run(
        [AFL_PLOT, str(writer.out_dir), str(plots)], capture_output=True, text=True, env=_tool_env()
    )
    assert run.returncode == 0, run.stdout + run.stderr
    for name in ("edges", "high_freq", "low_freq", "exec_speed"):
        png = (plots / f"{name}.png").read_bytes()
        assert png.startswith(b"\x89PNG") and len(png) > 4000, name
    assert "unit" in (plots / "index.html").read_text()


# --------------------------------------------------------------------------- names, views


def test_afl_queue_names():
    assert afl_queue_name(12, [3]) == "id:000012,src:000003,op:symcc"
    assert (
        afl_queue_name(7, [1, 2], "splice", new_cov=True)
        == "id:000007,src:000001+000002,op:splice,+cov"
    )
    assert afl_queue_name(0, orig="seed/a,b") == "id:000000,orig:seed_a_b"
    assert (
        afl_queue_name(5, [4], time_ms=10, execs=99)
        == "id:000005,src:000004,time:10,execs:99,op:symcc"
    )
    assert afl_queue_name(1, op=None) == "id:000001"
    assert len(afl_queue_name(1, orig="x" * 400).encode()) == 255
    with pytest.raises(ValueError):
        afl_queue_name(-1)
    assert parse_afl_queue_id("id:000012,src:000003,op:symcc") == 12
    assert parse_afl_queue_id(".state") is None and parse_afl_queue_id("README") is None


@given(st.lists(st.integers(0, AFL_SYNC_MAX_ID), unique=True, max_size=50))
def test_queue_names_sort_like_their_ids(ids):
    # afl-fuzz's sync walks the names in alphasort order: it must be id order.
    names = [afl_queue_name(i, [max(0, i - 1)], "symcc") for i in ids]
    assert sorted(names) == [afl_queue_name(i, [max(0, i - 1)], "symcc") for i in sorted(ids)]
    assert [parse_afl_queue_id(n) for n in names] == ids


def _render(renderable) -> str:
    console = Console(record=True, width=120, color_system=None)
    console.print(renderable)
    return console.export_text()


def test_live_panel_and_summary_table():
    snap = snapshot(recent_execs_per_sec=321.5)
    panel = _render(render_live(snap))
    for text in ("0:10:00", "120,000 (321.5/s)", "77", "40 (+35 found", "345/20,000 (1.73%)"):
        assert text in panel
    assert "2 workers" in panel and "0:00:12 ago" in panel
    table = _render(summary_table(snap))
    for text in ("120,000", "2 of 9 crashing runs", "1 of 3 hanging runs", "(78%)", "worker 2"):
        assert text in table
    assert "executions=60,000, generated=3,000,000" in table
    assert "0:10:00" in _render(summary_table(snap))
    empty = _render(render_live(CampaignSnapshot(start_time=T0, now=T0)))
    assert "never" in empty and "0 (0.0/s)" in empty


def test_summary_names_dispatch_recovery_only_when_something_was_repaired():
    quiet = dict.fromkeys(("send_failures", "stale_results", "invalid_joins",
                           "watchdog_timeouts", "worker_recoveries", "protocol_requeued",
                           "protocol_deferred"), 0)
    assert "dispatch recovery" not in _render(summary_table(
        snapshot(extra={"dispatch": {**quiet, "parked": []}})))
    table = _render(summary_table(snapshot(extra={"dispatch": {
        **quiet, "watchdog_timeouts": 2, "worker_recoveries": 1, "protocol_requeued": 2,
        "parked": [3]}})))
    assert "2 watchdog timeouts, 1 workers back, 2 requeued, parked: rank 3" in table
    assert "1 parked" in _render(render_live(snapshot(extra={"dispatch": {"parked": [3]}})))
    assert "parked" not in _render(render_live(snapshot(extra={"dispatch": {"parked": []}})))


def test_summary_groups_executor_failures_by_reason_only_when_there_are_any():
    assert "executor failures" not in _render(summary_table(snapshot()))
    groups = [{"reason": f"reason {index}", "count": 10 - index, "example_digest": "ab" * 32,
               "example_path": f"corpus/{'ab' * 32}" if index == 0 else None}
              for index in range(7)]
    table = _render(summary_table(snapshot(extra={"executor_errors": 49,
                                                  "executor_failures": groups})))
    assert "49 runs failed in the executor, not in the target (7 reasons)" in table
    assert "10 ×" in table and "reason 0 (e.g. corpus/abab" in table
    assert "reason 1 (e.g. abababababababab)" in table
    assert "reason 4" in table and "reason 5" not in table
    assert "2 more reasons in stats.json" in table


def test_a_stats_json_of_layout_1_names_its_failure_examples_as_it_did():
    group = {"reason": "SIGSEGV", "count": 2, "example_sha256": "cd" * 32, "example_path": None}
    table = _render(summary_table(snapshot(extra={"executor_errors": 2,
                                                  "executor_failures": [group]})))
    assert "SIGSEGV (e.g. cdcdcdcdcdcdcdcd)" in table
