"""Each rank's logging: a line per record on stderr, naming its rank, at SYMCC_MPI_LOG's level."""

from __future__ import annotations

import logging
import sys

from symcc_mpi.config import log_level


def configure_logging(rank: int) -> None:
    logging.basicConfig(
        level=log_level(),
        format=f"%(asctime)s rank {rank} %(levelname)s %(message)s",
        stream=sys.stderr,
    )
