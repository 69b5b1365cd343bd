"""The leader's hold on its lease, and which services are alive: a lease kept on a thread of its own, a
service on this host judged by its process as well as its heartbeat."""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from eventing.control.failover import LEADER_LEASE, LEASE_RENEW_S
from eventing.control.lifecycle import SERVICE_STALE_S
from eventing.errors import EventingError
from metadata import Lease

if TYPE_CHECKING:
    from eventing.control.service import EventingService

log = logging.getLogger("eventing.control.service")


class LeaseKeeper(threading.Thread):
    """Renews the leader lease every LEASE_RENEW_S on its own connection to the store, so a main loop busy
    stopping a function for seconds never lets the lease lapse. If another service holds it, or it cannot
    be renewed before it expires, the service stops (the new leader's claims have fenced its workers)."""

    def __init__(self, service: EventingService):
        super().__init__(name="eventing-lease", daemon=True)
        self.service = service
        self.done = threading.Event()
        self.store = service.state.open_metadata()  # a connection of its own: renewals never queue

    def run(self) -> None:
        svc = self.service
        renewed = time.monotonic()
        while not self.done.wait(LEASE_RENEW_S):
            try:
                lease = self.store.acquire_lease(
                    LEADER_LEASE, svc.service_id, svc.lease_ttl_s, info=svc._info()
                )
            except EventingError as exc:
                log.warning("cannot renew the leader lease (%s)", exc)
                if time.monotonic() - renewed > svc.lease_ttl_s:
                    svc.lost_leadership(None)
                    return
                continue
            if lease is None:
                holder = self.store.lease(LEADER_LEASE)
                svc.lost_leadership(holder.holder if holder else None)
                return
            renewed = time.monotonic()

    def finish(self) -> None:
        self.done.set()
        self.join(timeout=5)
        try:
            self.store.release_lease(LEADER_LEASE, self.service.service_id)
        finally:
            self.store.close()


def running_services(store) -> list[str]:
    """Services whose heartbeat is fresh and, on this host, whose process still exists (a service killed
    with kill -9 leaves a fresh heartbeat behind for up to SERVICE_STALE_S)."""
    return [sid for sid in store.live_services(SERVICE_STALE_S) if service_alive(sid)]


def expiry_hint(lease: Lease | None, holder: str) -> str:
    """For a service that may have been killed (its process elsewhere, or not yet reaped): when its claim
    lapses on its own, so the user knows how long to wait instead of guessing."""
    now = time.time()
    lapses = [SERVICE_STALE_S]  # its heartbeat counts for this long
    if lease is not None and lease.holder == holder and not lease.expired(now):
        lapses.append(lease.expires_at - now)
    return (
        f"; if that service was killed, its lease expires in at most {math.ceil(max(lapses))} s: run again "
        "then"
    )


def service_alive(service_id: str) -> bool:
    """A service on this host whose process is gone (or is a zombie no one has reaped yet, as after
    kill -9 of a child) is not alive, whatever its last heartbeat says."""
    host, _, rest = service_id.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


__all__ = ["LeaseKeeper", "expiry_hint", "running_services", "service_alive"]
