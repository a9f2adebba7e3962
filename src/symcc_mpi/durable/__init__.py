"""Durable coordination structures, pure of MPI: locks, lease tables, journals, WAL, QueryStore."""
