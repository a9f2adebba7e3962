"""A SymCC run that dies is a crash, one that times out a hang, only if the target's own run
does the same (witness.py); how a SymCC build is recognised, and a dying run's last words."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from symcc_mpi.config import CampaignConfig
from symcc_mpi.coverage.edges import FileCoverage, Status
from symcc_mpi.executors.base import ExecutionResult, Outcome
from symcc_mpi.executors.symcc import is_symcc_build, last_words
from symcc_mpi.executors.witness import Witness, failure_reason, make_witness

PLAIN_BUILD = Path(__file__).resolve().parents[2] / "examples" / "build" / "gate"
Z3_ABORT = (b"This is SymCC running with the QSYM backend\n"
            b"[STAT] SMT: { \"solving_time\": 10 }\n"
            b"terminate called after throwing an instance of 'z3::exception'\n"
            b"  what():  Sorts (_ BitVec 1) and Bool are incompatible\n"
            b"[STAT] SMT: { \"solving_time\": 12, \"total_time\": 40 }\n")
Z3_REASON = ("terminate called after throwing an instance of 'z3::exception': "
             "Sorts (_ BitVec 1) and Bool are incompatible")


def test_last_words_skip_qsym_statistics_and_join_an_uncaught_exception():
    assert last_words(Z3_ABORT) == Z3_REASON
    assert last_words(b"[INFO] x\nSegmentation fault\n\n") == "Segmentation fault"
    assert last_words(b"[STAT] SMT: {}\n") == ""
    assert last_words(b"a" * 500) == "a" * 200


def _died(signal_number: int, message: str = "") -> ExecutionResult:
    return ExecutionResult(Outcome.CRASH, -signal_number, 0.1, message=message,
                           generated=(Path("written-before-it-died"),))


def test_a_crash_or_hang_the_witness_repeats_stands():
    died = _died(11)
    assert Witness("the AFL build", lambda data, path: Status.CRASH).judge(
        died, b"x", Path("input"), "symcc", 10.0) is died
    hung = ExecutionResult(Outcome.TIMEOUT, -9, 10.0)
    assert Witness("the AFL build", lambda data, path: Status.HANG).judge(
        hung, b"x", Path("input"), "symcc", 10.0) is hung
    ran = ExecutionResult(Outcome.OK, 0, 0.1)
    never = Witness("the AFL build", lambda data, path: pytest.fail("an OK run was re-run"))
    assert never.judge(ran, b"x", Path("input"), "symcc", 10.0) is ran


def test_what_the_witness_does_not_repeat_is_an_executor_failure_with_its_reason():
    witness = Witness("the AFL build", lambda data, path: Status.OK)
    judged = witness.judge(_died(6, Z3_REASON), b"x", Path("input"), "symcc", 10.0)
    assert judged.outcome is Outcome.ERROR
    assert judged.message == f"SIGABRT in the symcc run, not in the AFL build: {Z3_REASON}"
    assert judged.generated == (Path("written-before-it-died"),)  # still staged and explored
    solving = ExecutionResult(Outcome.TIMEOUT, -9, 10.0, message="solving")
    assert witness.judge(solving, b"x", Path("input"), "symcc", 10.0).message == \
        "timed out after 10 s in the symcc run, not in the AFL build"
    hanging = Witness("the AFL build", lambda data, path: Status.HANG)
    assert hanging.judge(_died(11), b"x", Path("input"), "symcc", 2.5).message == \
        "SIGSEGV in the symcc run, not in the AFL build"
    assert failure_reason(_died(99), "symcc", "the plain build", 1.0) == \
        "signal 99 in the symcc run, not in the plain build"


def _script(tmp_path: Path, name: str, body: str) -> Path:
    script = tmp_path / name
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def _config(tmp_path: Path, target: Path, **fields) -> CampaignConfig:
    return CampaignConfig(target=(str(target), "@@"), seeds=None, out=tmp_path / "out",
                          timeout=1.0, **fields)


class _Probe:
    def __init__(self, status: Status):
        self.status = status
        self.probed: list[bytes] = []

    def probe_bytes(self, data: bytes) -> FileCoverage:
        self.probed.append(data)
        return FileCoverage(self.status, b"", b"", 1 << 16)


def test_the_witness_is_the_afl_build_then_the_plain_build_then_symccs_replay(tmp_path):
    # Dies of SIGSEGV on an input starting with "X", hangs on one starting with "Z", unless
    # SymCC's replay switch is set.
    crasher = _script(tmp_path, "crasher",
                      'if [ -n "$SYMCC_NO_SYMBOLIC_INPUT" ]; then exit 0; fi\n'
                      'case "$(head -c1 "$1")" in X) kill -SEGV $$;; Z) exec sleep 60;; esac\n'
                      'exit 0')
    sound = _script(tmp_path, "sound", "exit 0")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    input_path = tmp_path / "input"
    input_path.write_bytes(b"X marks the spot")

    probe = _Probe(Status.CRASH)
    witness = make_witness(_config(tmp_path, sound, plain_target=(str(sound), "@@")), "symcc",
                           probe, scratch)
    assert witness.name == "the AFL build" and witness.run(b"X", input_path) is Status.CRASH
    assert probe.probed == [b"X"]

    plain = make_witness(_config(tmp_path, sound, plain_target=(str(crasher), "@@")),
                         "symcc", None, scratch)
    assert plain.name == "the plain build" and plain.run(b"X", input_path) is Status.CRASH
    input_path.write_bytes(b"harmless")
    assert plain.run(b"harmless", input_path) is Status.OK
    input_path.write_bytes(b"Zzz")
    assert plain.run(b"Zzz", input_path) is Status.HANG
    input_path.write_bytes(b"X marks the spot")

    # The SymCC build replayed without symbolic input: this one does not die so.
    replay = make_witness(_config(tmp_path, crasher), "symcc", None, scratch)
    assert "SYMCC_NO_SYMBOLIC_INPUT=1" in replay.name
    assert replay.run(b"X", input_path) is Status.OK
    assert (scratch / "replay").is_dir() and not list((scratch / "replay").iterdir())

    # Triton confirms its crashes with its own native run; noop's runs never die.
    for executor in ("triton", "noop"):
        assert make_witness(_config(tmp_path, crasher), executor, _Probe(Status.OK),
                            scratch) is None


def test_a_symcc_build_is_recognised_by_the_runtime_it_calls(tmp_path):
    fake = tmp_path / "fake"
    fake.write_bytes(b"\x7fELF" + bytes(60) + b"\0_sym_initialize\0" + bytes(16))
    assert is_symcc_build(fake) is True
    script = _script(tmp_path, "script", "exit 0")
    assert is_symcc_build(script) is None
    empty = tmp_path / "empty-elf"
    empty.write_bytes(b"\x7fELF")
    assert is_symcc_build(empty) is False
    if not PLAIN_BUILD.exists():
        pytest.skip("examples not built (make examples)")
    assert is_symcc_build(PLAIN_BUILD) is False
