"""Connecting to Ray, on loopback when Ray is local.

Ray advertises the machine's own non-loopback address by default, and even an
explicit ``127.0.0.1`` (``ray.init(_node_ip_address=...)``, a bootstrap address
``127.0.0.1:port``) is rewritten to that address by
``ray._private.services.resolve_ip_for_localhost``, which asks
``get_node_ip_address()``. That function answers the loopback address when
Ray's multi-host support is off (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, read
when ``ray`` is imported and inherited by every raylet and worker the process
starts). So a Ray that lives on this machine only, the one
:func:`connect` starts for a run and the multi-node :func:`local_cluster` of
tests and benchmarks, is started from a process with that variable set, and
every node, raylet, worker and the driver then use 127.0.0.1. Joining a
cluster (``ray.address: auto`` or ``host:port``) leaves Ray's defaults alone:
a real cluster's nodes must reach each other.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from typing import Any

logger = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
LOCAL_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
"""Ray's switch for multi-host support; ``0`` makes it use the loopback address."""


class RayUnavailable(RuntimeError):
    """Ray is not installed, or local Ray was asked for after Ray was imported without it."""


def actor_threads(num_cpus: float) -> int:
    """Ray's rule for an actor's OMP threads: ``floor`` of the CPUs it reserves, at least 1.

    The learner and server actors follow it unless told otherwise, so actors that
    share a node do not each run one thread per core.
    """
    return max(1, math.floor(num_cpus))


def _import_ray(*, local: bool) -> Any:
    if local:
        if "ray" in sys.modules and os.environ.get(LOCAL_ONLY_ENV) != "0":
            raise RayUnavailable(
                f"ray was imported before a local Ray could be set up on {LOOPBACK}: set "
                f"{LOCAL_ONLY_ENV}=0 before importing ray, or join a cluster (ray.address)")
        os.environ[LOCAL_ONLY_ENV] = "0"
    try:
        import ray
    except ImportError:
        raise RayUnavailable("runtime=ray needs Ray: pip install 'sao-gym[ray]'") from None
    return ray


def connect(address: str | None, *, num_cpus: int | None = None,
            object_store_memory_mb: int | None = None) -> bool:
    """Connect this process to Ray; True when it started a local instance (see module docs).

    ``address`` None starts Ray on 127.0.0.1 with ``num_cpus`` logical CPUs
    (default ``max(4, cores)``: light actors need none, but the learner and
    workers may reserve some); ``"auto"`` or ``host:port`` joins a cluster.
    An already connected process is left as it is (False).
    """
    ray = _import_ray(local=address is None)
    if ray.is_initialized():
        return False
    common = {"include_dashboard": False, "configure_logging": False,
              "log_to_driver": True}
    if address is None:
        memory = object_store_memory_mb << 20 if object_store_memory_mb else None
        # "local": a new instance, even where another one (a test cluster) is found
        ray.init(address="local", num_cpus=num_cpus or max(4, os.cpu_count() or 1),
                 object_store_memory=memory, _node_ip_address=LOOPBACK, **common)
        logger.info("started a local Ray instance on %s", LOOPBACK)
        return True
    local_cluster_running = os.environ.get(LOCAL_ONLY_ENV) == "0"
    extra = {"_node_ip_address": LOOPBACK} if local_cluster_running else {}
    ray.init(address=address, **common, **extra)
    logger.info("joined the Ray cluster at %s", address)
    return False


def local_cluster(nodes: int, *, num_cpus: int = 2, object_store_memory_mb: int = 150) -> Any:
    """A ``ray.cluster_utils.Cluster`` of ``nodes`` nodes on this machine, all on 127.0.0.1.

    Each node gets a custom resource ``node<i>`` (1 unit) to pin actors to it.
    Connect with ``connect(cluster.address)``; ``cluster.shutdown()`` stops it.
    """
    _import_ray(local=True)
    from ray.cluster_utils import Cluster

    cluster = Cluster()
    for i in range(nodes):
        cluster.add_node(node_ip_address=LOOPBACK, num_cpus=num_cpus,
                         object_store_memory=object_store_memory_mb << 20,
                         resources={f"node{i}": 1.0}, include_dashboard=False)
    cluster.wait_for_nodes()
    return cluster
