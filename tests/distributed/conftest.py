"""One local Ray cluster of three 1-CPU "nodes" per test module (real Ray, no mocks).

Each node is a separate raylet with its own object store, so actors asking for one CPU
land on different nodes, as on a real cluster. Tests that need it take ``ray_cluster``.
"""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray", reason="the distributed tests need the ray extra: pip install 'steersman[ray]'")

STORE = 80 * 2**20  # per node: Ray's minimum is 75 MiB


@pytest.fixture(scope="module")
def ray_cluster():
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": STORE,
                                                             "include_dashboard": False})
    for _ in range(2):
        cluster.add_node(num_cpus=1, object_store_memory=STORE)
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
