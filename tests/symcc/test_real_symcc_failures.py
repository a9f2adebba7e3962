"""What a real SymCC campaign reports is true: a run of the SymCC build that dies is a crash,
one that times out a hang, only if the target's own run does the same on that input
(witness.py); otherwise it is an executor failure, counted by reason, and what the run wrote
is explored. And a plain build is no SymCC build, nor a SymCC build a plain one
(executors.check_executor)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from harness import assert_oracles, crash_files, crashes_natively, explore, stats
from realsymcc import BUILD
from test_real_symcc_executor import symcc_compile

from symcc_mpi.job.cli import cli

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(300)]

# Three symbolic comparisons lead to a real crash ("BUG": a store through NULL, in every
# build); a fourth only adds coverage. Its SymCC build then dies as SymCC's runtime does on
# many real targets (QSYM's solver throwing, signal 6) after writing what it solved: on every
# run with symbolic input, never in the AFL or plain build, nor replayed without symbolic
# input. And on an input whose fifth byte is 'S' its SymCC build never ends, as a solver that
# takes longer than the per-run timeout.
RUNTIME_DIES = r"""
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
int main(int argc, char **argv) {
    unsigned char buf[16] = {0};
    FILE *f = fopen(argv[1], "rb");
    size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
    if (f) fclose(f);
    int symbolic = getenv("SYMCC_OUTPUT_DIR") && !getenv("SYMCC_NO_SYMBOLIC_INPUT");
    if (n > 4 && buf[4] == 'S' && symbolic) for (;;) sleep(1);
    int score = 0;
    if (n > 0 && buf[0] == 'B') {
        score += 1;
        if (n > 1 && buf[1] == 'U') {
            score += 2;
            if (n > 2 && buf[2] == 'G') { volatile int *nowhere = 0; *nowhere = score; }
        }
    }
    if (n > 3 && buf[3] == '!') score += 4;
    if (symbolic) {
        fputs("terminate called after throwing an instance of 'z3::exception'\n"
              "  what():  Sorts (_ BitVec 1) and Bool are incompatible\n", stderr);
        abort();
    }
    return score;
}
"""
RUNTIME_LINE = ("terminate called after throwing an instance of 'z3::exception': "
                "Sorts (_ BitVec 1) and Bool are incompatible")


@pytest.fixture(scope="module")
def builds(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("runtime-dies")
    built = {"symcc": symcc_compile(tmp, "runtime-dies", RUNTIME_DIES),
             "plain": tmp / "runtime-dies.plain"}
    subprocess.run(["gcc", "-O0", "-o", str(built["plain"]), str(tmp / "runtime-dies.c")],
                   check=True, capture_output=True, timeout=120)
    if shutil.which("afl-clang-fast"):
        built["afl"] = tmp / "runtime-dies.afl"
        subprocess.run(["afl-clang-fast", "-O0", "-o", str(built["afl"]),
                        str(tmp / "runtime-dies.c")], check=True, capture_output=True,
                       timeout=120, env={**os.environ, "AFL_QUIET": "1"})
    seeds = tmp / "seeds"
    seeds.mkdir()
    (seeds / "plain").write_bytes(b"AAAAA")
    built["seeds"] = seeds
    return built


WITNESSES = {"afl": "the AFL build", "plain": "the plain build",
             "replay": "the SymCC build without symbolic input (SYMCC_NO_SYMBOLIC_INPUT=1)"}


@pytest.mark.parametrize("witness", sorted(WITNESSES))
def test_a_dying_runtime_is_an_executor_failure_and_a_real_crash_still_a_crash(
        builds, tmp_path, witness):
    if witness == "afl" and "afl" not in builds:
        pytest.skip("afl-clang-fast is not installed")
    extra = {"afl": ["--afl-target", f"{builds.get('afl')} @@"],
             "plain": ["--plain-target", f"{builds['plain']} @@"], "replay": []}[witness]
    out = tmp_path / "out"
    process = explore(out, "--executor", "symcc", "--target", f"{builds['symcc']} @@",
                      "--seeds", builds["seeds"], "--workers", 2, "--timeout", 3, *extra,
                      timeout=240)
    assert_oracles(out, process)

    # The real crash, found through inputs the dying runs wrote, and nothing else.
    crashes = crash_files(out)
    assert crashes, process.stdout[-3000:]
    for crash in crashes:
        data = crash.read_bytes()
        assert data.startswith(b"BUG"), data
        assert crashes_natively(builds["plain"], data, tmp_path), data

    figures = stats(out)
    extra_figures = figures["extra"]
    died = f"SIGABRT in the symcc run, not in {WITNESSES[witness]}: {RUNTIME_LINE}"
    solving = f"timed out after 3 s in the symcc run, not in {WITNESSES[witness]}"
    groups = {group["reason"]: group for group in extra_figures["executor_failures"]}
    assert set(groups) == {died, solving}, groups
    assert not list((out / "hangs").iterdir()) and figures["hangs"] == 0
    # Every run but those of "BUG..." ended in the runtime: the seed, "B....", "...!.",
    # "BU..."; "....S" never ended.
    assert groups[died]["count"] >= 3 and groups[solving]["count"] >= 1
    assert groups[died]["count"] + groups[solving]["count"] == extra_figures["executor_errors"]
    assert figures["executions"] - extra_figures["executor_errors"] <= figures["crashing_runs"]
    example = groups[died]
    assert example["example_digest"] in example["example_path"]
    assert (out / example["example_path"]).is_file()
    assert "executor failures" in process.stdout and RUNTIME_LINE[:60] in process.stdout


def test_a_symcc_build_is_refused_by_the_triton_executor(builds, tmp_path):
    from click.testing import CliRunner

    result = CliRunner().invoke(cli, ["explore", "--executor", "triton", "--target",
                                      f"{builds['symcc']} @@", "--seeds", str(builds["seeds"]),
                                      "--out", str(tmp_path / "o")])
    assert result.exit_code == 2, result.output
    assert result.output.strip() == (
        f"symcc-mpi: error: --executor triton: {builds['symcc']} is a SymCC build (it names "
        "_sym_initialize, SymCC's runtime entry): give Triton the plain build (gcc), or use "
        "--executor symcc")
    assert not (tmp_path / "o").exists()


def test_the_bundled_symcc_builds_are_recognised(builds):
    from symcc_mpi.executors.symcc import is_symcc_build

    assert is_symcc_build(builds["symcc"]) and is_symcc_build(BUILD / "json.symcc")
    assert is_symcc_build(builds["plain"]) is False and is_symcc_build(BUILD / "json") is False
    if "afl" in builds:
        assert is_symcc_build(builds["afl"]) is False
