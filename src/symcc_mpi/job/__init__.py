"""What a user runs: the command line, the self-launch under mpiexec or Slurm, a rank's life
from start to finish (session), and the live view and summary (progress).

The top layer: may import every package below it."""
