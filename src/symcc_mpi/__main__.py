"""`python -m symcc_mpi` is the `symcc-mpi` command."""

from symcc_mpi.job.cli import main

main()
