"""The example targets: they build, their seeds are benign, and their planted bugs are real
and reachable by concolic exploration (Triton executor, breadth-first from the seed)."""

from __future__ import annotations

import collections
import hashlib
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from symcc_mpi.executors.base import Outcome
from symcc_mpi.executors.triton import TritonExecutor

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BUILD = EXAMPLES / "build"
TARGETS = ("magic", "checksum", "tlv")
# Parsers whose planted bug lies too deep for the Triton breadth-first test: their seeds
# must fit the schema (exit 0) and their crasher must crash natively.
PARSERS = ("toml",)
# Larger benign seeds (each must exit 0), by seed directory: the program it feeds.
LARGE_SEEDS = {"toml-large": "toml", "json-large": "json", "ini-large": "ini"}
HAVE_AFL = shutil.which("afl-clang-fast") is not None and shutil.which("afl-showmap") is not None

pytestmark = pytest.mark.timeout(120)

# One input per planted bug, written by hand: documents the bug and proves it real.
CRASHERS = {
    "magic": (b"MAGIC!", signal.SIGSEGV),
    "checksum": (b"CK\x02\x00\x7f\xf5" + bytes([(0x7F + 0xF5) & 0xFF]), signal.SIGSEGV),
    "tlv": (b"TLV\x01\x03\x14" + b"overflowing-the-note" + b"\x00\x00", signal.SIGABRT),
    # An enabled plugin whose icon is one character beyond the BMP (4 bytes of UTF-8).
    "toml": (b'[[plugin]]\nname = "a"\nenabled = true\nicon = "\\U0001F600"\n', signal.SIGABRT),
}

# Executions a breadth-first exploration needs to reach the crash. Measured: magic 33,
# checksum 22, tlv 41 (same in file and stdin mode); the bounds leave some slack.
BFS_BUDGET = {"magic": 60, "checksum": 40, "tlv": 80}


@pytest.fixture(scope="session")
def built():
    subprocess.run(["make", "-s", "-C", str(EXAMPLES)], check=True)
    return BUILD


def seeds(name: str) -> list[Path]:
    return sorted((EXAMPLES / "seeds" / name).iterdir())


def native(binary: Path, data: bytes, mode: str, tmp_path: Path, env=None) -> int:
    if mode == "file":
        p = tmp_path / "input"
        p.write_bytes(data)
        proc = subprocess.run(
            [str(binary), str(p)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=10,
            env=env,
        )
    else:
        proc = subprocess.run([str(binary)], input=data, capture_output=True, timeout=10, env=env)
    return proc.returncode


def test_make_builds_every_target(built):
    for name in (*TARGETS, *PARSERS, "hashloop"):
        assert os.access(built / name, os.X_OK)
        if HAVE_AFL:
            assert os.access(built / f"{name}.afl", os.X_OK)


@pytest.mark.parametrize("mode", ["file", "stdin"])
@pytest.mark.parametrize("name", (*TARGETS, "hashloop"))
def test_seeds_are_benign(built, tmp_path, name, mode):
    env = dict(os.environ, HASHLOOP_ROUNDS="10")
    assert seeds(name)
    for seed in seeds(name):
        assert native(built / name, seed.read_bytes(), mode, tmp_path, env) >= 0


@pytest.mark.parametrize("mode", ["file", "stdin"])
@pytest.mark.parametrize("name", [*PARSERS, *LARGE_SEEDS])
def test_parser_seeds_fit_the_schema(built, tmp_path, name, mode):
    program = LARGE_SEEDS.get(name, name)
    assert seeds(name)
    for seed in seeds(name):
        assert native(built / program, seed.read_bytes(), mode, tmp_path) == 0, seed.name


@pytest.mark.parametrize("mode", ["file", "stdin"])
@pytest.mark.parametrize("name", (*TARGETS, *PARSERS))
def test_planted_bug_crashes_natively(built, tmp_path, name, mode):
    data, signo = CRASHERS[name]
    assert native(built / name, data, mode, tmp_path) == -signo


@pytest.mark.skipif(not HAVE_AFL, reason="afl++ is not installed")
@pytest.mark.parametrize("mode", ["file", "stdin"])
def test_toml_afl_build_crashes_too(built, tmp_path, mode):
    data, signo = CRASHERS["toml"]
    assert native(built / "toml.afl", data, mode, tmp_path) == -signo


# The toml overrun needs all of it: a document that fits the schema, an enabled plugin and an
# icon of one astral character, by escape or in raw UTF-8 (exit statuses 0, 1 or 3 otherwise).
TOML_NEAR_MISSES = [
    (b'[[plugin]]\nname = "a"\nenabled = true\nicon = "\xf0\x9f\x98\x80"\n', -signal.SIGABRT),
    (b'[[plugin]]\nname = "a"\nenabled = true\nicon = "\\u2605"\n', 0),  # in the BMP
    (b'[[plugin]]\nname = "a"\nenabled = false\nicon = "\\U0001F600"\n', 0),
    (b'[[plugin]]\nname = "a"\nicon = "\\U0001F600"\n', 0),  # not enabled
    (b'[[plugin]]\nname = "a"\nenabled = true\nicon = "\\U0001F600x"\n', 3),  # two chars
    (b'[[plugin]]\nenabled = true\nicon = "\\U0001F600"\n', 3),  # no name
    (b'x = 1\n[[plugin]]\nname = "a"\nenabled = true\nicon = "\\U0001F600"\n', 3),
    (b'[[plugin]]\nname = "a"\nenabled = true\nicon = "\\U0000D83D"\n', 1),  # surrogate
    (b'[[plugin]]\nname = "a"\nenabled = true\nicon = "\xed\xa0\xbd"\n', 1),
]


@pytest.mark.parametrize("data, status", TOML_NEAR_MISSES)
def test_toml_bug_needs_an_enabled_plugin_with_an_astral_icon(built, tmp_path, data, status):
    assert native(built / "toml", data, "stdin", tmp_path) == status


@pytest.mark.skipif(not HAVE_AFL, reason="afl++ is not installed")
@pytest.mark.parametrize("name", (*TARGETS, *PARSERS))
def test_afl_builds_agree(built, tmp_path, name):
    def showmap(data: bytes) -> int:
        p = tmp_path / "input"
        p.write_bytes(data)
        return subprocess.run(
            [
                "afl-showmap",
                "-q",
                "-o",
                str(tmp_path / "map"),
                "--",
                str(built / f"{name}.afl"),
                str(p),
            ],
            capture_output=True,
            timeout=30,
        ).returncode

    assert showmap(seeds(name)[0].read_bytes()) == 0
    assert showmap(CRASHERS[name][0]) == 2  # afl-showmap's "crashed"


def explore_until_crash(
    binary: Path, mode: str, root: Path, budget: int
) -> tuple[int, bytes] | None:
    """Breadth-first over generated inputs, deduplicated by SHA-256: (executions, crasher)."""
    argv = [str(binary), "@@"] if mode == "file" else [str(binary)]
    start = seeds(binary.name)
    queue = collections.deque(start)
    seen = {hashlib.sha256(p.read_bytes()).digest() for p in start}
    with TritonExecutor(argv, timeout=10) as ex:
        for n in range(1, budget + 1):
            if not queue:
                return None
            inp = queue.popleft()
            out = root / f"run{n}"
            out.mkdir()
            result = ex.run(inp, out)
            assert result.outcome in (Outcome.OK, Outcome.CRASH), result.message
            if result.outcome is Outcome.CRASH:
                return n, inp.read_bytes()
            for g in result.generated:
                h = hashlib.sha256(g.read_bytes()).digest()
                if h not in seen:
                    seen.add(h)
                    queue.append(g)
    return None


@pytest.mark.parametrize("name", TARGETS)
def test_triton_reaches_the_planted_bug_from_the_seed(built, tmp_path, name):
    found = explore_until_crash(built / name, "file", tmp_path, BFS_BUDGET[name])
    assert found is not None, f"{name}: no crash within {BFS_BUDGET[name]} executions"
    _, crasher = found
    assert native(built / name, crasher, "stdin", tmp_path) == -CRASHERS[name][1]


def test_stdin_mode_explores_the_same_way(built, tmp_path):
    found = explore_until_crash(built / "checksum", "stdin", tmp_path, BFS_BUDGET["checksum"])
    assert found is not None
