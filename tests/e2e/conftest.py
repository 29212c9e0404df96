"""Fixtures for the multi-host end-to-end tests: nspawn test clusters, ansible-playbook runs, commands on hosts.

Clusters come from tests/cluster/testcluster.py through tests/cluster/clusterclient.py (the bench scripts' client
too) and are taken down when their test module ends;
set DGLKIT_KEEP_CLUSTERS=1 to keep them for debugging (`testcluster.py status` lists them, and
`ssh -F /var/lib/dglkit-testcluster/<name>/ssh/config node1` gets you in).
"""
from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from jobhelpers import JOBS_NODE_DIR, JOBS_SERVER_PORT
from tests.cluster.clusterclient import Cluster, PlaybookRun, named, testcluster  # noqa: F401 (the tests' types)

KEEP = os.environ.get("DGLKIT_KEEP_CLUSTERS") == "1"

# Per test, its share of module fixtures included (a cluster and site.yml take minutes under load).
E2E_TIMEOUT = 1200


# test_builtin_tasks, test_collection, test_contacts, test_own_programs, test_train and test_tampering share the
# training cluster (train_cluster); test_jobs, test_mpi_partition, test_remove_node and test_home_tampering the jobs
# cluster (jobs_cluster); the order of the modules is tests/conftest.py's.
NODE3_NAME = "node3.cluster.test"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.e2e)
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(E2E_TIMEOUT))


@pytest.fixture(scope="module")
def cluster_factory() -> Iterator[Callable[..., Cluster]]:
    """make(name, hosts, storage_is_worker=False, cluster_network=False, node_dir="") starts a cluster that lives
    until the module ends; cluster_network: node-to-node traffic on a second network (dglkit_cluster_address);
    node_dir: a directory of each host's own at this path, where stand_up puts per-node venvs."""
    if os.geteuid() != 0:
        pytest.skip("test clusters need root")
    made: list[Cluster] = []

    def make(name: str, hosts: int, storage_is_worker: bool = False, cluster_network: bool = False,
             node_dir: str = "") -> Cluster:
        cluster = named(name)
        cluster.up(hosts, storage_is_worker, cluster_network, node_dir)
        made.append(cluster)
        return cluster

    yield make
    if not KEEP:
        for cluster in made:
            cluster.down()


def shared_cluster(name: str, prepare: Callable[[Cluster], None], cluster_network: bool = False,
                   node_dir: str = "") -> Iterator[Cluster]:
    """A 3-host cluster (node1 storage, node2 and node3 workers) for the modules of one group (tests/conftest.py),
    its inventory completed by prepare(cluster), stood up once with site.yml, down at the end of the session.
    cluster_network and node_dir as cluster_factory's."""
    if os.geteuid() != 0:
        pytest.skip("test clusters need root")
    cluster = named(name)
    cluster.up(3, False, cluster_network, node_dir)
    try:
        prepare(cluster)
        cluster.stand_up()
        yield cluster
    finally:
        if not KEEP:
            cluster.down()


def name_node3(cluster: Cluster) -> None:
    cluster.name_address(NODE3_NAME, cluster.hosts()["node3"])
    (cluster.inventory / "host_vars").mkdir(exist_ok=True)
    (cluster.inventory / "host_vars/node3.yml").write_text(f"dglkit_cluster_address: {NODE3_NAME}\n")


def jobs_settings(cluster: Cluster) -> None:
    # The mesh is opt-in: test_jobs' resize checks that the old nodes trust a new one over the cluster network,
    # test_mpi_partition's builder runs its ranks over it, test_remove_node takes a host out of it and
    # test_home_tampering plants links where it writes. A server port other than the default: ip_config.txt, the
    # firewall and the job must all follow it.
    (cluster.inventory / "group_vars/all/jobs.yml").write_text(
        f"dglkit_ssh_mesh: true\ndglkit_mpi: true\ndglkit_server_port: {JOBS_SERVER_PORT}\n"
        "dglkit_python_env_location: per_node\n")


@pytest.fixture(scope="session")
def train_cluster() -> Iterator[Cluster]:
    """The training modules' cluster; node3's cluster address is a host name that resolves on the controller alone
    (site.yml resolves it once, and every playbook uses that address). Each test leaves every host clean for the
    next."""
    yield from shared_cluster("train", name_node3)


@pytest.fixture(scope="session")
def jobs_cluster() -> Iterator[Cluster]:
    """The cluster of test_jobs, then test_mpi_partition, test_remove_node (takes node3 out and brings it back) and
    test_home_tampering (its last test takes node3 out for good): node-to-node traffic on a second network
    (`dglkit_cluster_address` differs from `ansible_host`), every host's own venv in its own directory
    (`dglkit_python_env_location: per_node`), the SSH mesh and Open MPI on."""
    yield from shared_cluster("jobs", jobs_settings, cluster_network=True, node_dir=JOBS_NODE_DIR)


@pytest.fixture(scope="session")
def train_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run folder of every job on train_cluster."""
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest, cluster_factory: Callable[..., Cluster]) -> Cluster:
    """Three hosts for the test module: node1 storage, node2 and node3 workers."""
    name = request.module.__name__.rpartition(".")[2].removeprefix("test_").replace("_", "-")[:24]
    return cluster_factory(name, 3)


@pytest.fixture(scope="session")
def testcluster_cli() -> Callable[..., subprocess.CompletedProcess]:
    """testcluster.py itself: cli("up", "--name", ..., check=False)."""
    return testcluster
