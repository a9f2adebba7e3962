"""Each rank's logging: a line per record on stderr, naming its rank, at SYMCC_MPI_LOG's level."""

from __future__ import annotations

import logging
import os
import sys


def configure_logging(rank: int) -> None:
    logging.basicConfig(
        level=os.environ.get("SYMCC_MPI_LOG", "INFO").upper(),
        format=f"%(asctime)s rank {rank} %(levelname)s %(message)s",
        stream=sys.stderr,
    )
