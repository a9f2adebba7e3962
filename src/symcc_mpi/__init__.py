"""symcc-mpi: distributed concolic-execution campaigns over MPI."""

__version__ = "0.1.0"
