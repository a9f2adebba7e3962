"""`symcc-mpi slurm-script`: a job script bash accepts, one Slurm task per rank, the campaign
resumed by a later job; mistakes in the explore options caught before anything is queued."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_cli_errors import one_line_error

from symcc_mpi.job.cli import cli

EXPLORE = ["--target", "./prog @@", "--seeds", "seeds", "--out", "campaign"]


def script(*args: str):
    return CliRunner().invoke(cli, ["slurm-script", *args])


@pytest.mark.parametrize("launcher, line", [
    ("self", 'explore --workers "$((SLURM_NTASKS - 1))" --target'),
    ("srun", "srun --mpi=pmix "),
    ("mpirun", '/mpirun "${AS_ROOT[@]}" '),
])
def test_the_script_asks_one_task_per_rank_and_starts_them_as_told(tmp_path, monkeypatch,
                                                                   launcher, line):
    monkeypatch.chdir(tmp_path)
    written = script("--workers", "7", "--time", "2:00:00", "--partition", "long",
                     "--launcher", launcher, "--", *EXPLORE)
    assert written.exit_code == 0, written.output
    text = written.output
    assert text.startswith("#!/bin/bash\n")
    for directive in ("--ntasks=8", "--requeue", "--open-mode=append", "--time=2:00:00",
                      "--partition=long", "--job-name=symcc-mpi"):
        assert f"#SBATCH {directive}\n" in text
    assert line in text and "--target './prog @@' --seeds seeds --out campaign" in text
    assert f"cd {tmp_path} " in text and f"OUT={tmp_path / 'campaign'}\n" in text
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0


def test_several_masters_take_a_task_each(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    text = script("--workers", "6", "--", *EXPLORE, "--masters", "2").output
    assert "#SBATCH --ntasks=8\n" in text
    assert 'explore --workers "$((SLURM_NTASKS - 2))" --target' in text


def test_a_later_job_resumes_the_campaign_and_the_last_line_is_its_exit_status(
        tmp_path, monkeypatch):
    """The script run outside Slurm, with a stand-in for symcc-mpi that logs what it is
    given and leaves a campaign behind."""
    monkeypatch.chdir(tmp_path)
    fake = tmp_path / "fake-symcc-mpi"
    fake.write_text('#!/bin/sh\necho "$*" >> log\nmkdir -p campaign\n'
                    'touch campaign/.symcc-mpi\nexit 3\n')
    fake.chmod(0o755)
    text = script("--", *EXPLORE).output
    job = tmp_path / "job.sh"
    job.write_text(text.replace(str(Path(sys.executable).parent / "symcc-mpi"), str(fake)))
    env = {**os.environ, "SLURM_NTASKS": "3"}
    for _ in range(2):
        ran = subprocess.run(["bash", str(job)], capture_output=True, text=True, env=env)
        assert ran.returncode == 3, ran.stderr
        assert ran.stdout.splitlines()[-1] == "symcc-mpi: the campaign exited with status 3"
    first, second = (tmp_path / "log").read_text().splitlines()
    assert first == "explore --workers 2 --target ./prog @@ --seeds seeds --out campaign"
    assert second == first + " --resume"


@pytest.mark.parametrize("args, pattern", [
    (["--", "--target", "x", "--seeds", "s", "--out", "o", "--workers", "3"],
     "--workers is the script's to decide"),
    (["--", "--target", "x", "--out", "o", "--resume"], "--resume is the script's to decide"),
    (["--", "--target", "x", "--seeds", "s", "--out", "o", "--bogus"],
     "the explore options: No such option '--bogus'"),
    (["--", "--seeds", "s", "--out", "o"], "the explore options: Missing option '--target'"),
    (["--", "--target", "x", "--seeds", "s"], "need --out DIR"),
    (["--workers", "0", "--", *EXPLORE], "--workers must be 1 or more (got 0)"),
])
def test_mistakes_get_one_line_before_anything_is_queued(args, pattern):
    one_line_error(script(*args), pattern)


def test_the_script_file_is_written_executable(tmp_path):
    target = tmp_path / "campaign.sbatch"
    assert script("-o", str(target), "--", *EXPLORE).exit_code == 0
    assert target.read_text().startswith("#!/bin/bash") and os.access(target, os.X_OK)
    one_line_error(script("-o", str(tmp_path / "no" / "such" / "dir.sbatch"), "--", *EXPLORE),
                   "cannot write")
