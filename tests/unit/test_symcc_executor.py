"""The SymCC subprocess contract, with small shell targets standing in for the target's side.

(The same contract with a real concolic engine behind it is tested in
test_symcc_contract.py through the Triton shim.)
"""

import os
import stat
import struct
import time
from pathlib import Path

import pytest

from symcc_mpi.executors import Outcome
from symcc_mpi.executors.symcc import (
    QSYM_MAP_SIZE,
    BranchCounts,
    SymccExecutor,
    decode_counters,
    preload_library,
    solver_seconds,
    targeted_map,
)


def script(tmp_path, name, body):
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


@pytest.fixture
def dirs(tmp_path):
    inp = tmp_path / "input"
    inp.write_bytes(b"hello")
    out = tmp_path / "gen"
    out.mkdir()
    return inp, out


def test_at_at_is_the_input_path_and_symcc_input_file_is_set(tmp_path, dirs):
    inp, out = dirs
    target = script(tmp_path, "t", 'cat "$1" > "$SYMCC_OUTPUT_DIR/a"\n'
                    'echo "$SYMCC_INPUT_FILE" > "$SYMCC_OUTPUT_DIR/b"\n')
    result = SymccExecutor([target, "@@"], timeout=5).run(inp, out)
    assert result.outcome is Outcome.OK and result.exit_status == 0
    assert (out / "a").read_bytes() == b"hello"
    assert (out / "b").read_text().strip() == str(inp)
    assert [p.name for p in result.generated] == ["a", "b"]


def test_without_at_at_input_is_on_stdin(tmp_path, dirs):
    inp, out = dirs
    target = script(tmp_path, "t", 'cat > "$SYMCC_OUTPUT_DIR/a"\n'
                    'echo "${SYMCC_INPUT_FILE-unset}" > "$SYMCC_OUTPUT_DIR/b"\n')
    result = SymccExecutor([target], timeout=5).run(inp, out)
    assert (out / "a").read_bytes() == b"hello"
    assert (out / "b").read_text().strip() == "unset"
    assert result.outcome is Outcome.OK


def test_unfinished_dot_files_are_not_test_cases(tmp_path, dirs):
    target = script(tmp_path, "t", 'echo a > "$SYMCC_OUTPUT_DIR/000000"\n'
                    'echo b > "$SYMCC_OUTPUT_DIR/.tmp-000001"\n')
    result = SymccExecutor([target], timeout=5).run(*dirs)
    assert [p.name for p in result.generated] == ["000000"]


def test_signal_death_is_a_crash(tmp_path, dirs):
    target = script(tmp_path, "t", "kill -SEGV $$\n")
    result = SymccExecutor([target], timeout=5).run(*dirs)
    assert result.outcome is Outcome.CRASH and result.exit_status == -11


def test_exit_code_is_not_a_crash(tmp_path, dirs):
    result = SymccExecutor([script(tmp_path, "t", "exit 3\n")], timeout=5).run(*dirs)
    assert result.outcome is Outcome.OK and result.exit_status == 3


def test_timeout_kills_the_whole_process_group(tmp_path, dirs):
    # The target starts a grandchild and waits until it wrote its pid; both would then sleep
    # far longer than the timeout, which is far longer than starting them takes on a busy
    # machine.
    pid_file = tmp_path / "grandchild.pid"
    target = script(tmp_path, "t", f"sh -c 'echo $$ > \"{pid_file}.tmp\"; "
                    f"mv \"{pid_file}.tmp\" \"{pid_file}\"; exec sleep 120' &\n"
                    f'while [ ! -s "{pid_file}" ]; do sleep 0.01; done\nsleep 120\n')
    started = time.monotonic()
    result = SymccExecutor([target], timeout=2).run(*dirs)
    assert result.outcome is Outcome.TIMEOUT
    assert time.monotonic() - started < 60  # the target would have slept 120 s
    grandchild = int(pid_file.read_text())
    try:
        assert gone_within(grandchild, 30), "a descendant of the timed-out target survived"
    finally:
        if not gone_within(grandchild, 0):
            os.kill(grandchild, 9)


def gone_within(pid: int, seconds: float) -> bool:
    """Whether `pid` has exited (a zombie counts: it runs no more) within `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def test_memory_limit_applies(tmp_path, dirs):
    target = script(tmp_path, "t", 'ulimit -v > "$SYMCC_OUTPUT_DIR/limit"\n')
    SymccExecutor([target], timeout=5, memory_limit_mb=64).run(*dirs)
    assert (dirs[1] / "limit").read_text().strip() == str(64 * 1024)


def test_solver_time_from_stat_lines():
    stderr = (b'[STAT] SMT: { "solving_time": 0, "total_time": 9 }\nnoise\n'
              b'[STAT] SMT: { "solving_time": 1500000 }\n[STAT] SMT: { broken }\n'
              b'[STAT] SMT: { "solving_time": 2000000, "total_time": 5000000 }\n')
    assert solver_seconds(stderr) == pytest.approx(2.0)  # a running total, not a sum


def test_missing_program_is_an_executor_error(tmp_path, dirs):
    result = SymccExecutor([str(tmp_path / "gone")], timeout=5).run(*dirs)
    assert result.outcome is Outcome.ERROR and "cannot start" in result.message
    assert os.listdir(dirs[1]) == []


def test_a_targeted_map_has_only_the_targets_new():
    qsym_map = targeted_map(frozenset({1, 3, QSYM_MAP_SIZE}))
    trace, contexts = qsym_map[:QSYM_MAP_SIZE], qsym_map[QSYM_MAP_SIZE:]
    assert len(contexts) == QSYM_MAP_SIZE and set(contexts) == {0xFF}
    assert [index for index, byte in enumerate(trace) if byte != 0xFF] == [0, 2, QSYM_MAP_SIZE - 1]
    assert trace[0] == trace[2] == trace[-1] == 0
    assert targeted_map(frozenset()) == b"\xff" * (2 * QSYM_MAP_SIZE)  # a trace


@pytest.mark.parametrize("target", [0, -1, QSYM_MAP_SIZE + 1])
def test_a_targeted_map_refuses_what_is_no_target(target):
    with pytest.raises(ValueError):
        targeted_map(frozenset({target}))


def counters_file(*, magic=0x73796D63634D5049, branches=9, solved_branches=4, records=1,
                  path=(), solved=()) -> bytes:
    """The counters file as symcc_preload.c leaves it (`path` may hold damaged entries)."""
    seen_bits, solved_bits = bytearray(QSYM_MAP_SIZE // 8), bytearray(QSYM_MAP_SIZE // 8)
    for targets, bits in ((path, seen_bits), (solved, solved_bits)):
        for index in (target - 1 for target in targets if 1 <= target <= QSYM_MAP_SIZE):
            bits[index // 8] |= 1 << index % 8
    entries = struct.pack(f"<{len(path)}I", *path).ljust(4 * QSYM_MAP_SIZE, b"\0")
    header = struct.pack("<6Q", magic, branches, solved_branches, 7, records, len(path))
    return header + seen_bits + solved_bits + entries


def test_counters_give_the_path_in_order_and_the_solved_among_it():
    data = counters_file(path=(500, 2, QSYM_MAP_SIZE, 9), solved=(9, 500))
    assert decode_counters(data) == BranchCounts(5, (500, 2, QSYM_MAP_SIZE, 9), (500, 9))


def test_counters_without_qsym_branch_map_give_no_path():
    assert decode_counters(counters_file(records=0, path=(4,))) == BranchCounts(5, None, ())


@pytest.mark.parametrize("data", [counters_file(magic=0), counters_file()[:-1], b"",
                                  counters_file()[:40] + struct.pack("<Q", QSYM_MAP_SIZE + 1)
                                  + counters_file()[48:],
                                  counters_file(path=(3, 0)),
                                  counters_file(path=(QSYM_MAP_SIZE + 1,))])
def test_counters_never_written_or_damaged_are_unknown(data):
    assert decode_counters(data) is None


def test_a_targeted_run_gets_a_map_of_its_own(tmp_path, dirs):
    library = preload_library(tmp_path / "cache")
    if library is None:
        pytest.skip("no C compiler for the preload library")
    campaign_map = tmp_path / "campaign.map"
    campaign_map.write_bytes(b"campaign")
    target = script(tmp_path, "t", 'cp "$SYMCC_AFL_COVERAGE_MAP" "$SYMCC_OUTPUT_DIR/map"\n'
                    'echo "$SYMCC_AFL_COVERAGE_MAP" > "$SYMCC_OUTPUT_DIR/where"\n')
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    executor = SymccExecutor([target], timeout=5, coverage_map=campaign_map, preload=library,
                             scratch=scratch)
    assert executor.targetable
    inp, out = dirs
    result = executor.run(inp, out, targets=frozenset({7}))
    assert result.outcome is Outcome.OK and result.path_targets is None  # no SymCC runtime
    assert (out / "map").read_bytes() == targeted_map(frozenset({7}))
    assert Path((out / "where").read_text().strip()).parent == scratch
    assert campaign_map.read_bytes() == b"campaign"
    for generated in result.generated:
        generated.unlink()
    executor.run(inp, out)
    assert (out / "where").read_text().strip() == str(campaign_map)
    executor.close()
    assert list(scratch.iterdir()) == []


def test_targets_need_the_preload_library(tmp_path, dirs):
    executor = SymccExecutor([script(tmp_path, "t", "exit 0\n")], timeout=5)
    assert not executor.targetable
    with pytest.raises(ValueError):
        executor.run(*dirs, targets=frozenset({1}))
