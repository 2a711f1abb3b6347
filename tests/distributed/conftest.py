"""One local Ray cluster of two 1-CPU "nodes" for the whole session (real Ray, no mocks).

Each node is a separate raylet with its own object store, so two actors asking for one
CPU each land on different nodes, as on a real cluster. Tests that need it take
``ray_cluster``. Starting nodes and actor processes (each imports torch) is what costs
time here: the tests share this cluster and start as few actors as what they prove needs.
"""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray", reason="the distributed tests need the ray extra: pip install 'steersman[ray]'")

STORE = 80 * 2**20  # per node: Ray's minimum is 75 MiB


@pytest.fixture(scope="session")
def ray_cluster():
    from ray.cluster_utils import Cluster

    # workers at the driver's priority (Ray's default niceness 15 starves the actors on a busy machine);
    # no autoscaler monitor and no log monitors (the tests read no worker logs): two Python
    # processes fewer to start, each importing Ray
    quiet = {"object_store_memory": STORE, "include_log_monitor": False}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                             "no_monitor": True, **quiet,
                                                             "_system_config": {"worker_niceness": 0}})
    cluster.add_node(num_cpus=1, **quiet)
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test here runs on one pytest-xdist worker (``--dist loadgroup`` in .ci/run), so
    the session starts one Ray cluster, not one per worker."""
    here = str(config.rootpath / "tests" / "distributed")
    for item in items:
        if str(item.path).startswith(here):
            item.add_marker(pytest.mark.xdist_group("ray"))
