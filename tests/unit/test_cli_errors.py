"""Every user mistake gets one line naming the problem, exit status 2, and no traceback."""

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from symcc_mpi.job.cli import cli

AFL_BUILD = Path(__file__).resolve().parents[2] / "examples" / "build" / "gate.afl"


@pytest.fixture
def setup(tmp_path):
    seeds = tmp_path / "seeds"
    seeds.mkdir()
    (seeds / "a").write_bytes(b"x")
    target = tmp_path / "target"
    target.write_text("#!/bin/sh\nexit 0\n")
    target.chmod(target.stat().st_mode | stat.S_IEXEC)
    return tmp_path, seeds, target


def run(*args):
    return CliRunner().invoke(cli, ["explore", *map(str, args)])


def one_line_error(result, pattern):
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("symcc-mpi: error: "), result.output
    assert pattern in lines[0], lines[0]
    assert "Traceback" not in result.output


def test_missing_target(setup):
    tmp, seeds, _ = setup
    one_line_error(run("--target", tmp / "nope @@", "--seeds", seeds, "--out", tmp / "o"),
                   "does not exist")


def test_non_executable_target(setup):
    tmp, seeds, target = setup
    target.chmod(0o644)
    one_line_error(run("--target", f"{target} @@", "--seeds", seeds, "--out", tmp / "o"),
                   "not an executable file")


def test_target_command_without_program(setup):
    tmp, seeds, _ = setup
    one_line_error(run("--target", "@@", "--seeds", seeds, "--out", tmp / "o"),
                   "names no program")
    one_line_error(run("--target", "", "--seeds", seeds, "--out", tmp / "o"), "names no program")


def test_program_not_on_path(setup):
    tmp, seeds, _ = setup
    one_line_error(run("--target", "no-such-program-xyz @@", "--seeds", seeds,
                       "--out", tmp / "o"), "not found on PATH")


def test_empty_seed_directory(setup):
    tmp, _, target = setup
    (tmp / "empty").mkdir()
    one_line_error(run("--target", target, "--seeds", tmp / "empty", "--out", tmp / "o"),
                   "holds no input files")


def test_missing_seed_directory(setup):
    tmp, _, target = setup
    one_line_error(run("--target", target, "--seeds", tmp / "gone", "--out", tmp / "o"),
                   "does not exist")


def test_foreign_output_directory_is_left_alone(setup):
    tmp, seeds, target = setup
    out = tmp / "o"
    out.mkdir()
    (out / "thesis.tex").write_text("keep me")
    one_line_error(run("--target", target, "--seeds", seeds, "--out", out),
                   "holds no symcc-mpi campaign")
    assert os.listdir(out) == ["thesis.tex"]


def test_unwritable_output(setup):
    tmp, seeds, target = setup
    one_line_error(run("--target", target, "--seeds", seeds, "--out", "/proc/self/out"),
                   "not writable")


def test_zero_workers(setup):
    tmp, seeds, target = setup
    one_line_error(run("--target", target, "--seeds", seeds, "--out", tmp / "o",
                       "--workers", 0), "--workers must be at least 1")


def test_executor_not_installed(setup, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "tritondse" else real(name, *a))
    tmp, seeds, target = setup
    one_line_error(run("--target", target, "--seeds", seeds, "--out", tmp / "o"),
                   "needs the Python package 'tritondse'")


def test_mpiexec_missing(setup, monkeypatch):
    tmp, seeds, target = setup
    monkeypatch.setattr(sys, "executable", str(tmp / "nowhere" / "python"))
    monkeypatch.setenv("PATH", str(tmp / "nowhere"))
    for name in ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"):
        monkeypatch.delenv(name, raising=False)
    one_line_error(run("--target", target, "--seeds", seeds, "--out", tmp / "o",
                       "--executor", "noop"), "mpiexec not found")


def test_resume_of_nothing(setup):
    tmp, _, target = setup
    one_line_error(run("--target", target, "--out", tmp / "o", "--resume"),
                   "no symcc-mpi campaign to resume")


def test_real_process_prints_no_traceback(setup):
    """The installed console script, not just click's runner."""
    tmp, _, target = setup
    script = Path(sys.executable).with_name("symcc-mpi")
    process = subprocess.run([str(script), "explore", "--target", str(target), "--seeds",
                              str(tmp / "gone"), "--out", str(tmp / "o")],
                             capture_output=True, text=True, timeout=60)
    assert process.returncode == 2
    assert process.stderr.strip().startswith("symcc-mpi: error: seed directory")
    assert "Traceback" not in process.stderr + process.stdout


def test_verify_of_a_non_campaign(tmp_path):
    result = CliRunner().invoke(cli, ["verify", str(tmp_path)])
    assert result.exit_code == 2 and "holds no symcc-mpi campaign" in result.output


def test_corrupt_state_file_is_refused_before_launch(setup):
    from symcc_mpi.campaign.corpus import CampaignDir

    tmp, seeds, target = setup
    campaign = CampaignDir(tmp / "o")
    campaign.create({})
    campaign.state.mkdir(exist_ok=True)
    campaign.done_journal.write_bytes(b'not json\n{"sha256": "' + b"a" * 64 + b'"}\n')
    before = campaign.done_journal.read_bytes()
    one_line_error(run("--target", target, "--out", tmp / "o", "--resume"),
                   "done.jsonl, line 1")
    assert campaign.done_journal.read_bytes() == before


def test_unparsable_fault_plan(setup, monkeypatch):
    tmp, seeds, target = setup
    monkeypatch.setenv("SYMCC_MPI_FAULTS", "1:pause@2=forever")
    one_line_error(run("--target", f"{target} @@", "--seeds", seeds, "--out", tmp / "o"),
                   "SYMCC_MPI_FAULTS: cannot parse '1:pause@2=forever'")
    assert not (tmp / "o").exists()


def test_negative_workers(setup):
    tmp, seeds, target = setup
    one_line_error(run("--target", target, "--seeds", seeds, "--out", tmp / "o",
                       "--workers", -3), "--workers must be at least 1")


def test_more_workers_than_memory_holds_is_refused_before_mpiexec(setup, monkeypatch):
    import symcc_mpi.job.launch as launch

    monkeypatch.setattr(launch, "launch", lambda *a, **k: pytest.fail("mpiexec was started"))
    tmp, seeds, target = setup
    one_line_error(run("--target", f"{target} @@", "--seeds", seeds, "--out", tmp / "o",
                       "--executor", "noop", "--workers", 100000), "at most")


def test_worker_bound_is_what_the_available_memory_holds():
    from symcc_mpi.config import UsageError
    from symcc_mpi.job.launch import RANK_MEMORY, check_workers

    check_workers(3, available=4 * RANK_MEMORY)  # 3 workers + the master
    with pytest.raises(UsageError, match="at most 3 workers fit"):
        check_workers(4, available=4 * RANK_MEMORY)
    with pytest.raises(UsageError, match="at most 0 workers fit"):
        check_workers(1, available=RANK_MEMORY)


def test_in_an_allocation_of_several_nodes_each_holds_its_share(monkeypatch):
    from symcc_mpi.config import UsageError
    from symcc_mpi.job.launch import RANK_MEMORY, check_workers

    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "4")
    check_workers(15, available=4 * RANK_MEMORY)  # 16 ranks, 4 on each node
    with pytest.raises(UsageError, match=r"5 MPI ranks on this node \(of 4\), .* at most "
                                         r"15 workers fit"):
        check_workers(16, available=4 * RANK_MEMORY)


def test_resume_of_a_live_campaign_is_refused_before_mpiexec(setup, monkeypatch):
    import symcc_mpi.job.launch as launch
    from symcc_mpi.campaign.corpus import CampaignDir

    monkeypatch.setattr(launch, "launch", lambda *a, **k: pytest.fail("mpiexec was started"))
    tmp, seeds, target = setup
    live = CampaignDir(tmp / "o")
    live.create({})
    live.lock()  # the running master
    # Its journal ends in a line being appended: nothing but its master may touch it.
    live.done_journal.write_bytes(b'{"sha256": "' + b"a" * 64 + b'"}\n{"sha2')
    before = live.done_journal.read_bytes()
    try:
        one_line_error(run("--target", f"{target} @@", "--out", tmp / "o", "--resume",
                           "--executor", "noop"), "another campaign is running in")
    finally:
        live.close()
    assert live.done_journal.read_bytes() == before


def test_resume_on_a_read_only_filesystem_is_refused_before_mpiexec(setup, monkeypatch):
    import symcc_mpi.job.launch as launch
    from symcc_mpi.campaign.corpus import CampaignDir

    monkeypatch.setattr(launch, "launch", lambda *a, **k: pytest.fail("mpiexec was started"))
    tmp, seeds, target = setup
    disk = tmp / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here (it needs root): "
                    f"{mounted.stderr.strip()}")
    try:
        CampaignDir(disk / "o").create({})
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        one_line_error(run("--target", f"{target} @@", "--out", disk / "o", "--resume",
                           "--executor", "noop"), "not writable: Read-only file system")
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


@pytest.mark.parametrize("extra, pattern", [
    (("--out", "OUT"), "leave out --out"),
    (("--name", "../elsewhere"), "--name '../elsewhere'"),
    (("--masters", "2", "--workers", "2"), "--afl-sync runs with one master"),
])
def test_hybrid_mistakes(setup, extra, pattern):
    tmp, seeds, target = setup
    extra = [str(tmp / "o") if value == "OUT" else value for value in extra]
    one_line_error(run("--target", f"{target} @@", "--afl-target", f"{target} @@",
                       "--afl-sync", tmp / "afl", *extra), pattern)
    assert not (tmp / "afl").exists()


def test_hybrid_needs_the_afl_build(setup):
    tmp, seeds, target = setup
    one_line_error(run("--target", f"{target} @@", "--afl-sync", tmp / "afl"),
                   "--afl-sync needs --afl-target")


def test_neither_out_nor_afl_sync(setup):
    tmp, seeds, target = setup
    one_line_error(run("--target", f"{target} @@", "--seeds", seeds),
                   "--out DIR is required (or --afl-sync AFL_OUT)")


def test_an_afl_target_that_is_no_afl_build(setup):
    tmp, seeds, target = setup
    one_line_error(run("--target", f"{target} @@", "--afl-target", f"{target} @@",
                       "--seeds", seeds, "--out", tmp / "o"),
                   f"--afl-target: AFL target is not an ELF executable: {target}")


@pytest.mark.skipif(not AFL_BUILD.exists(), reason="no AFL build of the examples (make examples)")
def test_hybrid_refuses_an_afl_instance_of_the_same_name(setup):
    tmp, seeds, target = setup
    fuzzer = tmp / "afl" / "symcc-mpi"
    (fuzzer / "queue").mkdir(parents=True)
    (fuzzer / "fuzzer_stats").write_text("fuzzer_pid : 1\n")
    one_line_error(run("--target", f"{target} @@", "--afl-target", f"{AFL_BUILD} @@",
                       "--afl-sync", tmp / "afl"), "holds no symcc-mpi campaign")
    assert (fuzzer / "fuzzer_stats").read_text() == "fuzzer_pid : 1\n"


@pytest.mark.parametrize("where, why", [("/nonexistent", "no such directory"),
                                        ("FILE", "not a directory")])
def test_a_scratch_directory_that_cannot_be_used_is_refused_before_mpiexec(setup, monkeypatch,
                                                                           where, why):
    import symcc_mpi.job.launch as launch

    monkeypatch.setattr(launch, "launch", lambda *a, **k: pytest.fail("mpiexec was started"))
    tmp, seeds, target = setup
    where = target if where == "FILE" else where
    one_line_error(run("--target", f"{target} @@", "--seeds", seeds, "--out", tmp / "o",
                       "--executor", "noop", "--scratch", where),
                   f"--scratch {where}: cannot make a scratch directory there: {why}")
    assert not (tmp / "o").exists()


def test_scratch_is_absolute_and_a_resume_may_name_another(setup, monkeypatch):
    import symcc_mpi.job.launch as launch
    from symcc_mpi.campaign.corpus import CampaignDir

    launched = []
    monkeypatch.setattr(launch, "launch", lambda config, argv, live: launched.append(config))
    tmp, seeds, target = setup
    (tmp / "here").mkdir()
    (tmp / "there").mkdir()
    monkeypatch.chdir(tmp)
    args = ["--target", f"{target} @@", "--out", tmp / "o", "--executor", "noop"]
    result = run(*args, "--seeds", seeds, "--scratch", "here")
    assert result.exit_code == 0, result.output
    assert launched[-1].scratch == tmp / "here"
    CampaignDir(tmp / "o").create(launched[-1].to_json())  # what the first run's master does
    result = run(*args, "--resume", "--scratch", tmp / "there")
    assert result.exit_code == 0, result.output
    assert launched[-1].scratch == tmp / "there" and launched[-1].resume
    assert run("--target", f"{target} @@", "--out", tmp / "p", "--executor", "noop",
               "--seeds", seeds).exit_code == 0
    assert launched[-1].scratch is None  # each node's temporary directory


PLAIN_BUILD = AFL_BUILD.with_name("gate")


def _no_launch(monkeypatch):
    """Any mpiexec start fails the test: a refusal must come before it."""
    import symcc_mpi.job.launch

    def launch(*args, **kwargs):
        raise AssertionError("mpiexec was started")

    monkeypatch.setattr(symcc_mpi.job.launch, "launch", launch)


def test_symcc_executor_refuses_a_plain_build_before_mpiexec(setup, monkeypatch):
    tmp, seeds, _ = setup
    _no_launch(monkeypatch)
    one_line_error(run("--executor", "symcc", "--target", f"{PLAIN_BUILD} @@", "--seeds", seeds,
                       "--out", tmp / "o"),
                   f"--executor symcc: {PLAIN_BUILD} is not a SymCC build (it names no "
                   "_sym_initialize, SymCC's runtime entry): compile it with SymCC (`make "
                   "symcc` builds one")
    assert not (tmp / "o").exists()


def test_symcc_executor_refuses_a_script_unless_told_it_wraps_a_symcc_build(setup, monkeypatch):
    tmp, seeds, target = setup
    _no_launch(monkeypatch)
    one_line_error(run("--executor", "symcc", "--target", f"{target} @@", "--seeds", seeds,
                       "--out", tmp / "o"),
                   f"{target} is not a SymCC build (not an ELF program)")
    monkeypatch.setenv("SYMCC_MPI_SKIP_BIN_CHECK", "1")
    with pytest.raises(AssertionError, match="mpiexec was started"):
        CliRunner().invoke(cli, ["explore", "--executor", "symcc", "--target", f"{target} @@",
                                 "--seeds", str(seeds), "--out", str(tmp / "o")],
                           catch_exceptions=False)


def test_a_plain_target_that_cannot_run_is_refused(setup):
    tmp, seeds, target = setup
    one_line_error(run("--target", f"{target} @@", "--plain-target", f"{tmp / 'gone'} @@",
                       "--seeds", seeds, "--out", tmp / "o"),
                   f"--plain-target: program {tmp / 'gone'} does not exist")
