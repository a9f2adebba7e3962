"""`symcc-mpi slurm-script`: the batch script that runs a campaign as a Slurm job.

The script asks for one task per rank (the master and its workers), runs the campaign in the
allocation and, when its output directory already holds the campaign, continues it with
`--resume`: a job that Slurm requeues after preempting it (`--requeue`), or a second job
submitted after a cancelled one, picks up where the first stopped.

Slurm ends a job (scancel, preemption, the time limit) by sending SIGTERM to every process of
it: the master stops the campaign, commits what it has and prints its summary; the workers
wait for its STOP, and a run the signal cut short goes back to the frontier. How the ranks are
started decides whether that stop is clean:

- `self`: symcc-mpi starts mpiexec itself inside the allocation, with ULFM fault tolerance;
- `srun`: `srun --mpi=pmix` starts the ranks (Slurm's PMIx plugin; no ULFM: a dead rank ends
  the job and the next one resumes);
- `mpirun`: Open MPI's mpirun answers SIGTERM by killing the job within a second or two: what
  was committed stays, the work in flight is done again by the next job.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from symcc_mpi.campaign.layout import MARKER

LAUNCHERS = ("self", "srun", "mpirun")


@dataclass(frozen=True)
class JobScript:
    explore: tuple[str, ...]  # `symcc-mpi explore`'s options, --out absolute
    out: Path
    workers: int
    masters: int  # explore's --masters: one task each too
    program: Path  # the symcc-mpi to run, absolute
    directory: Path  # where the job runs (relative paths in `explore` are from here)
    launcher: str = "self"
    time: str | None = None
    partition: str | None = None
    job_name: str = "symcc-mpi"
    output: str | None = None

    def render(self) -> str:
        directives = [f"--job-name={self.job_name}", f"--ntasks={self.workers + self.masters}",
                      "--requeue", "--open-mode=append"]
        if self.time:
            directives.append(f"--time={self.time}")
        if self.partition:
            directives.append(f"--partition={self.partition}")
        if self.output:
            directives.append(f"--output={self.output}")
        explore = " ".join(shlex.quote(arg) for arg in self.explore)
        program = shlex.quote(str(self.program))
        launch = {
            "self": f'{program} explore --workers "$((SLURM_NTASKS - {self.masters}))"',
            "srun": f"srun --mpi=pmix {program} explore",
            "mpirun": f'{shlex.quote(str(self.program.parent / "mpirun"))} "${{AS_ROOT[@]}}" '
                      f"{program} explore",
        }[self.launcher]
        return "\n".join([
            "#!/bin/bash",
            f"# A symcc-mpi campaign: {self.masters} master(s) and {self.workers} workers, one "
            "Slurm task each.",
            "# Written by `symcc-mpi slurm-script`; submit it with sbatch.",
            *(f"#SBATCH {directive}" for directive in directives),
            "",
            f"cd {shlex.quote(str(self.directory))} || exit 1",
            f"OUT={shlex.quote(str(self.out))}",
            "RESUME=()",
            f'if [ -f "$OUT/{MARKER}" ]; then',
            "    RESUME=(--resume)  # a requeued or later job continues the campaign",
            '    echo "symcc-mpi: continuing the campaign in $OUT"',
            "fi",
            *(["AS_ROOT=()", '[ "$(id -u)" = 0 ] && AS_ROOT=(--allow-run-as-root)']
              if self.launcher == "mpirun" else []),
            "# Slurm's SIGTERM (scancel, preemption) reaches every process of the job: the",
            "# campaign stops itself; the shell waits for it and reports how it ended.",
            "trap 'echo \"symcc-mpi: SIGTERM from Slurm: the campaign is stopping\" >&2' TERM",
            f'{launch} {explore} "${{RESUME[@]}}" &',
            "while :; do",
            "    wait $!; STATUS=$?",
            "    kill -0 $! 2>/dev/null || break  # wait returns early when a trap ran",
            "done",
            'echo "symcc-mpi: the campaign exited with status $STATUS"',
            'exit "$STATUS"',
            "",
        ])
