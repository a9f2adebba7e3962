"""How a several-master job's work-lease table is configured: its TTL and its lock wait, from
the campaign's timeouts or the environment. (Its shards are its masters: leases.py.)"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from symcc_mpi.config import work_lease_settings

DEFAULT_EXECUTION_TIMEOUT = 10.0
DEFAULT_SHUTDOWN_GRACE = 5.0


def default_ttl(execution_timeout: float = DEFAULT_EXECUTION_TIMEOUT) -> float:
    """F320 §6: `max(120, 4 * timeout)` seconds."""
    return max(120.0, 4.0 * execution_timeout)


def default_lock_acquire_timeout(shutdown_grace: float = DEFAULT_SHUTDOWN_GRACE) -> float:
    """F320 §6: `min(30, max(1, shutdown_grace / 4))` seconds."""
    return min(30.0, max(1.0, shutdown_grace / 4.0))


@dataclass(frozen=True)
class LeaseConfig:
    """The table's knobs (F320 §6): `FencedWorkLeaseTable(..., **config.options())`.

    `from_env` rule: unset or blank → default. Otherwise TTL and lock timeout must be a finite
    number of seconds > 0; anything else (`"abc"`, `"0"`, `"-3"`, `"nan"`, `"inf"`) → default,
    and the variable's name and value are listed in `rejected` for the caller to log.
    """

    ttl: float = field(default_factory=default_ttl)
    lock_timeout: float = field(default_factory=default_lock_acquire_timeout)
    rejected: tuple[str, ...] = ()

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str] | None = None,
        *,
        execution_timeout: float = DEFAULT_EXECUTION_TIMEOUT,
        shutdown_grace: float = DEFAULT_SHUTDOWN_GRACE,
    ) -> LeaseConfig:
        settings = work_lease_settings(env)
        return cls(
            ttl=settings.ttl if settings.ttl is not None else default_ttl(execution_timeout),
            lock_timeout=settings.lock_timeout if settings.lock_timeout is not None
            else default_lock_acquire_timeout(shutdown_grace),
            rejected=settings.rejected,
        )

    def options(self) -> dict[str, Any]:
        return {"ttl": self.ttl, "lock_timeout": self.lock_timeout}


# --- errors -------------------------------------------------------------------------------------
