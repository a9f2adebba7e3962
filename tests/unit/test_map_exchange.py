"""map_exchange.py: the masters of one job publish their maps to files in the job's lease
directory and read each other's when they change (MapExchange.exchange, which ORs them
in: test_federation.py)."""

from __future__ import annotations

import os

from symcc_mpi.coverage.pruning import MAP_SIZE
from symcc_mpi.federation.map_exchange import TRIAGE, MapExchange, map_path

ANY_SIZE = range(1, 1 << 20)


def test_a_map_is_read_once_per_rewrite_and_written_only_when_it_changed(tmp_path):
    first, second = MapExchange(tmp_path, 0, [1]), MapExchange(tmp_path, 1, [0])
    assert second.changed(TRIAGE, ANY_SIZE) == []  # nothing published yet
    first.publish(TRIAGE, b"\x01\x00")
    first.publish(TRIAGE, b"\x01\x00")  # the same map: not written again
    assert first.statistics().published == 1
    assert second.changed(TRIAGE, ANY_SIZE) == [b"\x01\x00"]
    assert second.changed(TRIAGE, ANY_SIZE) == []  # unchanged since
    first.publish(TRIAGE, b"\x01\x02")
    assert second.changed(TRIAGE, ANY_SIZE) == [b"\x01\x02"]
    assert second.statistics().read == 2


def test_a_file_that_cannot_be_a_map_is_counted_and_never_returned(tmp_path, caplog):
    reader = MapExchange(tmp_path, 1, [0])
    path = map_path(tmp_path, 0, "pruning")
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\x01" * 10)
    assert reader.changed("pruning", range(MAP_SIZE, MAP_SIZE + 1)) == []
    assert reader.changed("pruning", range(MAP_SIZE, MAP_SIZE + 1)) == []  # counted once
    assert reader.statistics().rejected == 1
    assert "is not a map this master can merge (10 bytes)" in caplog.text
    os.truncate(path, 0)
    assert reader.changed(TRIAGE, ANY_SIZE) == []  # another kind: no file
