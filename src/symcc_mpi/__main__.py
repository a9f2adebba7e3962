"""`python -m symcc_mpi` is the `symcc-mpi` command."""

from .cli import main

main()
