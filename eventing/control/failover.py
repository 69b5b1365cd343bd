"""Node failover (Couchbase's auto-failover followed by a rebalance) and the service's leader lease.

Failover: the service watches the Ray nodes its eventing nodes are pinned to. A node is *down* while Ray's
node table says it is dead or its raylet does not accept connections (Ray's own table takes ~15 s to notice
a killed raylet: 5 missed health checks 3 s apart; the raylet's port answers or refuses at once). A node
down for `failover_timeout` without a break is failed over: marked `failed`, and its vBuckets go to the
surviving nodes by the minimal-move planner, claimed with higher epochs (so any late write of the dead
node's workers is fenced). The decision is pure (FailoverDetector) so it is tested without Ray.

Leadership: one service is the leader; it holds LEADER_LEASE in the metadata store and renews it every
LEASE_RENEW_S. A service started with `--standby` waits until the lease is free (expired, released, or its
holder's process is gone) and then takes it with a compare-and-set, as Flink's JobManager HA does.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from eventing.core.durations import DurationError, parse_duration
from eventing.errors import ConfigError

log = logging.getLogger("eventing.control.failover")

# failover_timeout: `eventing run --failover-timeout`, else $EVENTING_FAILOVER_TIMEOUT, else 10 s; 0 turns
# automatic failover off (a dead node's vBuckets then wait until it comes back or is removed).
FAILOVER_TIMEOUT_ENV = "EVENTING_FAILOVER_TIMEOUT"
DEFAULT_FAILOVER_TIMEOUT_S = 10.0
HEALTH_POLL_S = 1.0  # how often the service looks at the pinned Ray nodes
PROBE_TIMEOUT_S = 0.5  # a raylet that does not accept a connection within this is down

# The leader lease: `eventing run` holds it; a `--standby` service waits on it.
LEADER_LEASE = "service-leader"
LEASE_TTL_ENV = "EVENTING_LEADER_LEASE"
DEFAULT_LEASE_TTL_S = 5.0
LEASE_RENEW_S = 1.0
STANDBY_POLL_S = 0.5


def failover_timeout_s(value: str | None = None) -> float:
    """The failover timeout in seconds from the flag's value, else the environment, else the default."""
    return _seconds(value, FAILOVER_TIMEOUT_ENV, DEFAULT_FAILOVER_TIMEOUT_S, "--failover-timeout")


def lease_ttl_s() -> float:
    """How long the leader lease lasts unrenewed: $EVENTING_LEADER_LEASE, default 5 s."""
    ttl = _seconds(None, LEASE_TTL_ENV, DEFAULT_LEASE_TTL_S, "the leader lease")
    if ttl < 2 * LEASE_RENEW_S:
        raise ConfigError(f"{LEASE_TTL_ENV}={ttl:g}s is too short; use at least {2 * LEASE_RENEW_S:g}s")
    return ttl


def _seconds(value: str | None, env: str, default: float, what: str) -> float:
    raw = value if value is not None else os.environ.get(env)
    if raw is None or raw == "":
        return default
    try:
        return parse_duration(raw, field=what if value is not None else f"${env}").total_seconds()
    except DurationError as exc:
        raise ConfigError(f"{'eventing run' if value is not None else 'the environment'} {exc}") from None


@dataclass
class FailoverDetector:
    """Decides which eventing nodes have been down for `timeout_s` without a break.

    `observe(now, health)` gets, per watched eventing node, (alive, why) and returns the nodes now due for
    failover (each once); a node seen alive again starts from zero, so a blip shorter than the timeout
    never fails a node over.
    """

    timeout_s: float
    down_since: dict[str, float] = field(default_factory=dict)
    why: dict[str, str] = field(default_factory=dict)

    def observe(self, now: float, health: Mapping[str, tuple[bool, str]]) -> list[str]:
        for node in [n for n in self.down_since if n not in health]:
            self.forget(node)  # no longer watched (failed over, removed, unpinned)
        for node, (alive, why) in health.items():
            if alive:
                if node in self.down_since:
                    log.warning(
                        "eventing node %s is reachable again after %.1fs", node, now - self.down_since[node]
                    )
                self.forget(node)
            elif node not in self.down_since:
                log.warning(
                    "eventing node %s looks down (%s); %s",
                    node,
                    why,
                    f"failover in {self.timeout_s:g}s unless it recovers"
                    if self.timeout_s > 0
                    else "no automatic failover (--failover-timeout 0): its vBuckets wait for it",
                )
                self.down_since[node] = now
                self.why[node] = why
        if self.timeout_s <= 0:
            return []
        due = [n for n, t in self.down_since.items() if now - t >= self.timeout_s]
        return sorted(due, key=lambda n: (self.down_since[n], n))

    def forget(self, node: str) -> None:
        self.down_since.pop(node, None)
        self.why.pop(node, None)


def failover_survivors(owning: Iterable[str], failing: Iterable[str]) -> list[str]:
    """The nodes that take over: those holding vBuckets now, minus the failing ones (joining nodes wait for
    their own rebalance, as in Couchbase). Empty when the failing nodes are all there is: nothing to do."""
    gone = set(failing)
    return [n for n in owning if n not in gone]


def ray_node_health(ray_node_ids: Iterable[str]) -> dict[str, tuple[bool, str]]:
    """(alive, why) per Ray node id, from Ray's node table and a TCP probe of each node's raylet."""
    import ray

    wanted = set(ray_node_ids)
    table = {n["NodeID"]: n for n in ray.nodes() if n["NodeID"] in wanted}
    out: dict[str, tuple[bool, str]] = {}
    for node_id in wanted:
        entry = table.get(node_id)
        if entry is None:
            out[node_id] = (False, "not in Ray's node table")
        elif not entry.get("Alive"):
            out[node_id] = (False, "dead in Ray's node table")
        else:
            out[node_id] = _probe(entry.get("NodeManagerAddress"), entry.get("NodeManagerPort"))
    return out


def _probe(host: str | None, port: int | None) -> tuple[bool, str]:
    if not host or not port:
        return True, ""
    try:
        with socket.create_connection((host, int(port)), timeout=PROBE_TIMEOUT_S):
            return True, ""
    except OSError as exc:
        return False, f"its raylet at {host}:{port} does not answer ({exc.strerror or exc})"


def wall_of(monotonic_t: float) -> float:
    """A time.monotonic() reading as wall-clock seconds (for records other processes read)."""
    return time.time() - (time.monotonic() - monotonic_t)


__all__ = [
    "DEFAULT_FAILOVER_TIMEOUT_S",
    "FAILOVER_TIMEOUT_ENV",
    "LEADER_LEASE",
    "FailoverDetector",
    "failover_survivors",
    "failover_timeout_s",
    "lease_ttl_s",
    "ray_node_health",
]
