"""Command line: `symcc-mpi explore | status | verify | slurm-script`."""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import click

from symcc_mpi.campaign.layout import CampaignError
from symcc_mpi.config import (
    EXECUTORS,
    FAULT_TOLERANCE_MODES,
    PRUNING_MODES,
    CampaignConfig,
    UsageError,
    parse_command,
)
from symcc_mpi.job.slurm import LAUNCHERS

GC_YOUNG_THRESHOLD = 20_000  # allocations between young collections in a rank (Python: 700)


class _Fail(click.ClickException):
    exit_code = 2

    def format_message(self) -> str:
        return self.message

    def show(self, file=None) -> None:
        click.echo(f"symcc-mpi: error: {self.message}", err=True)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="symcc-mpi")
def cli() -> None:
    """Distributed concolic-execution campaigns over MPI."""


@cli.command()
@click.option("--target", required=True, metavar="CMD",
              help="Target command line; @@ stands for the input file, else stdin.")
@click.option("--seeds", type=click.Path(path_type=Path), metavar="DIR",
              help="Directory of seed inputs (optional with --resume or --afl-sync).")
@click.option("--out", type=click.Path(path_type=Path), metavar="DIR",
              help="Campaign directory (on a filesystem every master sees; see "
                   "--results-via for the workers).")
@click.option("--scratch", type=click.Path(path_type=Path), metavar="DIR",
              help="Node-local directory for temporary files: each worker's executor runs, "
                   "QSYM map, object cache and coverage probes live in a directory it makes "
                   "there and removes at exit; only their results go to --out. Default: each "
                   "node's temporary directory ($TMPDIR or /tmp), coverage probes in /dev/shm.")
@click.option("--results-via", type=click.Choice(["auto", "files", "mpi"]), default="auto",
              show_default=True,
              help="How a worker hands its generated inputs to its master: files in "
                   "--out/.staging (its node must see --out), messages over MPI (only the "
                   "masters' nodes need --out), or auto: files where a worker sees --out, "
                   "MPI where it does not.")
@click.option("--afl-sync", type=click.Path(path_type=Path), metavar="AFL_OUT",
              help="Hybrid campaign beside AFL++ fuzzers run with -o AFL_OUT: it lives in "
                   "AFL_OUT/NAME, imports their queues and waits for them when it has nothing "
                   "left (stop it with --wall-timeout, --max-idle or Ctrl-C).")
@click.option("--name", default="symcc-mpi", show_default=True,
              help="With --afl-sync: the campaign's instance name in AFL_OUT.")
@click.option("--workers", type=int, default=2, show_default=True,
              help="Worker ranks when symcc-mpi starts mpiexec itself.")
@click.option("--masters", type=int, default=1, show_default=True,
              help="Masters sharing the campaign, each with its share of the ranks; every "
                   "input is analysed once across all of them.")
@click.option("--executor", type=click.Choice(EXECUTORS), default="triton", show_default=True)
@click.option("--afl-target", metavar="CMD",
              help="AFL-instrumented build for coverage triage (afl-showmap); it also "
                   "confirms that a SymCC run's crash or hang is the target's.")
@click.option("--plain-target", metavar="CMD",
              help="Without --afl-target: a plain build of the target that confirms a SymCC "
                   "run's crash or hang (default: the SymCC build replayed without symbolic "
                   "input).")
@click.option("--timeout", type=float, default=10.0, show_default=True,
              help="Seconds per execution.")
@click.option("--memory-limit", type=int, metavar="MB", help="Address-space limit per run.")
@click.option("--wall-timeout", type=float, metavar="SECONDS", help="Budget of the campaign.")
@click.option("--max-idle", type=float, metavar="SECONDS",
              help="Stop after this long without a new input or crash.")
@click.option("--pruning", type=click.Choice(PRUNING_MODES), default="shared", show_default=True,
              help="SymCC: QSYM's coverage map and linearization; shared = one campaign map "
                   "merged from every worker, local = one per worker, off = solve everything.")
@click.option("--fault-tolerance", type=click.Choice(FAULT_TOLERANCE_MODES), default=None,
              help="Survive the death of ranks with ULFM (Open MPI's fault tolerance). "
                   "Default: on when symcc-mpi starts mpiexec itself, auto under your own "
                   "mpirun/srun.")
@click.option("--split/--no-split", default=False, show_default=True,
              help="When fewer inputs wait than workers are free, split one input's branches "
                   "among them (executors that can be targeted: triton, symcc). Off by "
                   "default: slower to the same coverage in 13 of 16 measured pairs.")
@click.option("--resume", is_flag=True, help="Continue the campaign in --out.")
@click.option("--no-live", is_flag=True, help="Progress lines instead of the live view.")
def explore(target, seeds, out, afl_sync, name, workers, masters, executor, afl_target,
            plain_target, timeout, memory_limit, wall_timeout, max_idle, pruning,
            fault_tolerance, split, resume, no_live, scratch, results_via) -> None:
    """Explore a target from seed inputs with N workers until the frontier is exhausted
    (or, with --afl-sync, beside AFL++ fuzzers until stopped)."""
    from symcc_mpi.campaign.afl_sync import check_instance_name
    from symcc_mpi.job.checks import check_config
    from symcc_mpi.job.launch import check_workers, launch, launched_by_us, under_mpi

    try:
        if afl_sync is not None:
            if out is not None:
                raise UsageError("--afl-sync AFL_OUT puts the campaign in AFL_OUT/NAME "
                                 "(--name): leave out --out")
            try:
                out = afl_sync / check_instance_name(name)
            except ValueError as error:
                raise UsageError(str(error)) from None
        elif out is None:
            raise UsageError("--out DIR is required (or --afl-sync AFL_OUT)")
        if seeds is None and not resume and afl_sync is None:
            raise UsageError("--seeds DIR is required (unless --resume or --afl-sync)")
        config = CampaignConfig(
            target=parse_command(target, "--target"),
            seeds=seeds.absolute() if seeds is not None else None,
            out=out.absolute(),
            afl_sync=afl_sync.absolute() if afl_sync is not None else None,
            workers=workers,
            masters=masters,
            executor=executor,
            afl_target=parse_command(afl_target, "--afl-target") if afl_target else None,
            plain_target=parse_command(plain_target, "--plain-target") if plain_target else None,
            timeout=timeout,
            memory_limit_mb=memory_limit,
            wall_timeout=wall_timeout,
            max_idle=max_idle,
            pruning=pruning,
            split=split,
            resume=resume,
            scratch=scratch.absolute() if scratch is not None else None,
            results_via=results_via,
            fault_tolerance=fault_tolerance or ("on" if launched_by_us() else "auto"),
        )
        if under_mpi():
            # A rank allocates short-lived objects by the thousand per task, and what it
            # imported lives as long as it: young collections less often (Python's 700 was
            # ~5% of the master's CPU), and nothing imported walked by them.
            gc.freeze()
            gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
            # Only a rank loads the session: it initialises MPI on import, which would cost
            # the launcher a second and give mpiexec's children a singleton's environment.
            from symcc_mpi.job.session import run_rank

            sys.exit(run_rank(config))
        check_config(config)
        check_workers(config.workers, config.masters)
        sys.exit(launch(config, sys.argv[1:], live=not no_live and sys.stdout.isatty()))
    except (UsageError, CampaignError) as error:
        raise _Fail(str(error)) from None


@cli.command()
@click.argument("out", type=click.Path(path_type=Path))
def status(out: Path) -> None:
    """Show the progress and figures of a campaign directory."""
    from symcc_mpi.job.progress import print_status

    try:
        print_status(out)
    except CampaignError as error:
        raise _Fail(str(error)) from None


@cli.command()
@click.argument("out", type=click.Path(path_type=Path))
def verify(out: Path) -> None:
    """Check a finished campaign: content names, nothing analysed twice, nothing left over."""
    from symcc_mpi.campaign.verify import verify_campaign

    try:
        problems, facts = verify_campaign(out)
    except CampaignError as error:
        raise _Fail(str(error)) from None
    for name, value in facts.items():
        click.echo(f"{name:>28}: {value}")
    for problem in problems:
        click.echo(f"FAIL {problem}", err=True)
    if problems:
        sys.exit(1)
    click.echo("OK")



@cli.command("slurm-script", context_settings={"ignore_unknown_options": True,
                                               "allow_interspersed_args": False})
@click.option("--workers", type=int, default=2, show_default=True,
              help="Worker ranks: the job asks for one Slurm task per worker and per master.")
@click.option("--launcher", type=click.Choice(LAUNCHERS), default="self", show_default=True,
              help="self: symcc-mpi starts mpiexec in the allocation (ULFM fault tolerance); "
                   "srun: srun --mpi=pmix; mpirun: Open MPI's mpirun.")
@click.option("--time", metavar="TIME", help="Slurm's --time (the job's limit).")
@click.option("--partition", metavar="NAME", help="Slurm's --partition.")
@click.option("--job-name", default="symcc-mpi", show_default=True)
@click.option("--output", metavar="PATTERN",
              help="Slurm's --output for the job's log (default: slurm-%j.out where it is "
                   "submitted).")
@click.option("-o", "--script", type=click.Path(path_type=Path, dir_okay=False),
              help="Write the script here (executable) instead of to stdout.")
@click.argument("explore_options", nargs=-1, type=click.UNPROCESSED)
def slurm_script(workers, launcher, time, partition, job_name, output, script,
                 explore_options) -> None:
    """Write a Slurm batch script that runs a campaign: give it `explore`'s options.

    \b
        symcc-mpi slurm-script --workers 15 --time 8:00:00 -o campaign.sbatch -- \\
            --target "./prog @@" --seeds seeds --out /shared/campaign
        sbatch campaign.sbatch

    A job submitted again (or requeued after a preemption) continues the campaign."""
    from symcc_mpi.job.slurm import JobScript

    if workers < 1:
        raise _Fail(f"slurm-script: --workers must be 1 or more (got {workers})")
    options = list(explore_options)
    for decided in ("--workers", "--resume"):
        if any(o == decided or o.startswith(decided + "=") for o in options):
            raise _Fail(f"slurm-script: {decided} is the script's to decide: leave it out of "
                        "the explore options")
    try:
        parsed = explore.make_context("explore", list(options)).params  # it eats its list
    except click.ClickException as error:
        raise _Fail(f"slurm-script: the explore options: {error.format_message()}") from None
    if parsed["afl_sync"] is not None:
        out = parsed["afl_sync"] / parsed["name"]
    elif parsed["out"] is not None:
        out = parsed["out"]
    else:
        raise _Fail("slurm-script: the explore options need --out DIR (or --afl-sync AFL_OUT)")
    text = JobScript(tuple(options), out.absolute(), workers, parsed["masters"],
                     Path(sys.executable).parent / "symcc-mpi",  # the venv's entry point
                     Path.cwd(), launcher=launcher, time=time, partition=partition,
                     job_name=job_name, output=output).render()
    if script is None:
        click.echo(text, nl=False)
        return
    try:
        script.write_text(text)
        script.chmod(0o755)
    except OSError as error:
        raise _Fail(f"slurm-script: cannot write {script}: {error.strerror}") from None


def main() -> None:
    cli(prog_name="symcc-mpi")
