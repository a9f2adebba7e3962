"""The Triton executor and the Triton shim against real tritondse on small real binaries."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from symcc_mpi.executors.base import ExecutorError, Outcome
from symcc_mpi.executors.triton import TritonExecutor

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
BUILD = EXAMPLES / "build"

pytestmark = pytest.mark.timeout(120)

# Small targets for what the examples do not exercise. Each reads stdin.
SNIPPETS = {
    # 'L': loops forever; 'C': crashes natively, but the emulator (which does not fault on a
    # NULL write) goes on into the loop; anything else: exits 0.
    "loop": r"""
        #include <stdio.h>
        int main(void) {
            unsigned char b[4] = {0};
            fread(b, 1, sizeof b, stdin);
            volatile unsigned long i = 0;
            if (b[0] == 'C') *(volatile int *)0 = 1;
            if (b[0] == 'L' || b[0] == 'C') for (;;) i++;
            return 0;
        }""",
    # sscanf is not modelled by tritondse: an engine limit, not a finding.
    "unsupported": r"""
        #include <stdio.h>
        int main(void) {
            char b[16] = {0};
            int x = 0;
            fread(b, 1, 15, stdin);
            if (b[0] == 'A') return 3;
            if (sscanf(b, "%d", &x) == 1 && x == 42) return 7;
            return 0;
        }""",
    # tritondse's __ctype_b_loc table is short: bytes >= 0xAC read past it.
    "ctype": r"""
        #include <ctype.h>
        #include <stdio.h>
        int main(void) {
            unsigned char b[16] = {0};
            size_t n = fread(b, 1, 15, stdin);
            int spaces = 0;
            for (size_t i = 0; i < n; i++) if (isspace(b[i])) spaces++;
            return b[0] == 'Z' ? 4 : spaces;
        }""",
}


@pytest.fixture(scope="session")
def examples():
    subprocess.run(["make", "-s", "-C", str(EXAMPLES), "plain"], check=True)
    return BUILD


@pytest.fixture(scope="session")
def snippets(tmp_path_factory):
    d = tmp_path_factory.mktemp("snippets")
    out = {}
    for name, src in SNIPPETS.items():
        (d / f"{name}.c").write_text(src)
        subprocess.run(["gcc", "-O0", "-o", str(d / name), str(d / f"{name}.c")], check=True)
        out[name] = d / name
    return out


@pytest.fixture(scope="module")
def executors():
    """One executor (one server) per command line, shared by the tests of this module."""
    made: dict[tuple, TritonExecutor] = {}

    def get(*argv, timeout=10.0):
        key = (tuple(str(a) for a in argv), timeout)
        if key not in made:
            made[key] = TritonExecutor([str(a) for a in argv], timeout=timeout)
        return made[key]

    yield get
    for ex in made.values():
        ex.close()


def write(tmp_path: Path, name: str, data: bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


def outdir(tmp_path: Path, name: str = "out") -> Path:
    d = tmp_path / name
    d.mkdir()
    return d


def contents(result) -> list[bytes]:
    return [p.read_bytes() for p in result.generated]


# -- executor ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["file", "stdin"])
def test_finds_the_next_magic_byte(examples, executors, tmp_path, mode):
    argv = [examples / "magic", "@@"] if mode == "file" else [examples / "magic"]
    ex = executors(*argv)
    assert ex.stdin_mode is (mode == "stdin")
    seed = write(tmp_path, "seed", b"hello world\n")
    result = ex.run(seed, outdir(tmp_path))
    assert result.outcome is Outcome.OK, result.message
    assert result.exit_status == 0
    assert contents(result) == [b"Mello world\n"]
    assert [p.name for p in result.generated] == ["000000"]  # QSYM's naming
    assert result.solver_time > 0
    assert result.extra["queries"] == 1


def test_follows_the_chain_one_byte_per_run(examples, executors, tmp_path):
    ex = executors(examples / "magic", "@@")
    result = ex.run(write(tmp_path, "in", b"MAGxx!"), outdir(tmp_path))
    assert b"MAGIx!" in contents(result)


@pytest.mark.parametrize(
    "target,data,signo",
    [
        ("magic", b"MAGIC!", signal.SIGSEGV),
        ("tlv", b"TLV\x01\x03\x14" + b"A" * 20 + b"\x00\x00", signal.SIGABRT),
    ],
)
def test_real_crash_is_crash(examples, executors, tmp_path, target, data, signo):
    # tlv dies in abort(), which tritondse treats as a clean exit: the native run decides.
    result = executors(examples / target, "@@").run(write(tmp_path, "in", data), outdir(tmp_path))
    assert result.outcome is Outcome.CRASH
    assert result.exit_status == -signo
    assert result.generated  # the branches before the crash were still explored


# The loop never ends, so its timeout may be far above what the runs that do end (the
# server's "ok" run below, the native crash) take on a busy machine.
LOOP_TIMEOUT = 5.0


@pytest.mark.slow
def test_timeout_kills_the_process_group(snippets, executors, tmp_path):
    ex = executors(snippets["loop"], timeout=LOOP_TIMEOUT)
    ex.start()  # the server's start-up (tritondse's import: seconds on a busy machine) is
    # not what the bound below is about
    t = time.monotonic()
    result = ex.run(write(tmp_path, "in", b"LLLL"), outdir(tmp_path))
    assert result.outcome is Outcome.TIMEOUT
    assert result.exit_status == -signal.SIGKILL
    assert time.monotonic() - t < LOOP_TIMEOUT + 30  # the target would loop for ever
    # Neither the emulation nor the native run of the target survives.
    deadline = time.monotonic() + 30
    while _processes_running(str(snippets["loop"])) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _processes_running(str(snippets["loop"]))
    # The same server goes on serving.
    ok = ex.run(write(tmp_path, "ok", b"ok"), outdir(tmp_path, "out2"))
    assert ok.outcome is Outcome.OK and ok.exit_status == 0
    assert ex.server_starts == 1


@pytest.mark.slow
def test_native_crash_survives_an_emulation_timeout(snippets, executors, tmp_path):
    result = executors(snippets["loop"], timeout=LOOP_TIMEOUT).run(
        write(tmp_path, "in", b"CCCC"), outdir(tmp_path)
    )
    assert result.outcome is Outcome.CRASH
    assert result.exit_status == -signal.SIGSEGV


def test_engine_limit_is_an_error_not_a_crash(snippets, executors, tmp_path):
    result = executors(snippets["unsupported"]).run(write(tmp_path, "in", b"12"), outdir(tmp_path))
    assert result.outcome is Outcome.ERROR
    assert "sscanf" in result.message and "\n" not in result.message
    assert result.exit_status == 0  # what the real program did
    assert contents(result) == [b"A2"]  # flips before the stop are kept


def test_short_ctype_table_is_no_false_crash(snippets, executors, tmp_path):
    result = executors(snippets["ctype"]).run(
        write(tmp_path, "in", b"\xb0\xc0\xfe hi"), outdir(tmp_path)
    )
    assert result.outcome is Outcome.OK, result.message
    assert result.exit_status == 1


def test_dead_server_is_restarted(examples, tmp_path):
    with TritonExecutor([str(examples / "magic")], timeout=10) as ex:
        seed = write(tmp_path, "seed", b"hello world\n")
        assert ex.run(seed, outdir(tmp_path, "a")).outcome is Outcome.OK
        server = ex._server
        os.kill(server.pid, signal.SIGKILL)
        server.wait()
        again = ex.run(seed, outdir(tmp_path, "b"))
        assert again.outcome is Outcome.OK and contents(again) == [b"Mello world\n"]
        assert ex.server_starts == 2
        server = ex._server
    assert server.poll() is not None  # close() stopped it


def test_construction_errors(tmp_path):
    with pytest.raises(ExecutorError, match="not found or not executable"):
        TritonExecutor([str(tmp_path / "nope")], timeout=1)
    with pytest.raises(ExecutorError):
        TritonExecutor([], timeout=1)


def test_missing_tritondse_is_one_line_executor_error():
    # -S: no site-packages, so tritondse is really absent.
    code = (
        "from symcc_mpi.executors.triton import TritonExecutor\n"
        "try:\n    TritonExecutor(['/bin/true'], timeout=1)\n"
        "except Exception as e:\n    print(type(e).__name__, e)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    out = subprocess.run(
        [sys.executable, "-S", "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.startswith("ExecutorError tritondse is not installed: ")
    assert out.stdout.count("\n") == 1


def _processes_running(needle: str) -> list[int]:
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if needle.encode() in (d / "cmdline").read_bytes():
                    found.append(int(d.name))
            except OSError:
                pass
    return found


# -- shim -------------------------------------------------------------------------------

STAT = re.compile(r'\[STAT\] SMT: \{ "solving_time": (\d+)(, "total_time": \d+)? \}')


SHIM = Path(__file__).resolve().parents[1] / "triton_shim.py"  # a SymCC binary look-alike


def shim(argv, out: Path, *, stdin: bytes = b"", input_file: Path | None = None):
    env = dict(os.environ, SYMCC_OUTPUT_DIR=str(out))
    env.pop("SYMCC_INPUT_FILE", None)
    if input_file is not None:
        env["SYMCC_INPUT_FILE"] = str(input_file)
    return subprocess.Popen(
        [sys.executable, str(SHIM), *map(str, argv)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    ), stdin


def test_shim_behaves_like_a_symcc_binary(examples, tmp_path):
    seed = write(tmp_path, "seed", b"hello world\n")
    crash = write(tmp_path, "crash", b"MAGIC!")
    outs = [outdir(tmp_path, f"out-{n}") for n in ("stdin", "file", "crash", "ignored")]
    # Started together: each pays the tritondse import.
    runs = [
        shim([examples / "magic"], outs[0], stdin=b"hello world\n"),
        shim([examples / "magic", seed], outs[1], input_file=seed),
        shim([examples / "magic", crash], outs[2], input_file=crash),
        # SYMCC_INPUT_FILE not among the arguments: the input is stdin, as with SymCC.
        shim([examples / "magic"], outs[3], stdin=b"hello world\n", input_file=crash),
    ]
    results = [(p, *p.communicate(data, timeout=60)) for p, data in runs]

    for i in (0, 1, 3):
        proc, _, err = results[i]
        assert proc.returncode == 0, err
        assert sorted(p.name for p in outs[i].iterdir()) == ["000000"]
        assert (outs[i] / "000000").read_bytes() == b"Mello world\n"
        stats = STAT.findall(err.decode())
        assert stats and int(stats[-1][0]) > 0

    proc, _, err = results[2]
    assert proc.returncode == -signal.SIGSEGV  # died of the target's signal, not exit(139)
    assert len(list(outs[2].iterdir())) == 6
