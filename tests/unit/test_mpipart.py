"""The distributed partitioner (dglkit.mpiassign, dglkit.mpibuild) under a real mpirun on loopback, 2 and 4
ranks on the shared synthetic graph (a degree-corrected block model: a partitioner's cut shows)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from dglkit import leanpart
from dglkit.mpiassign import load_assignment

APP = Path(__file__).resolve().parents[2] / "app"
MPIRUN = ["mpirun", "--oversubscribe", "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo"]
ENV = {**os.environ, "PYTHONPATH": str(APP), "DGLBACKEND": "pytorch",
       "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def mpi_command(ranks: int, program: str, *args: object) -> list[str]:
    return [*MPIRUN, "-np", str(ranks), sys.executable, "-m", f"dglkit.{program}", *map(str, args)]


def mpirun(ranks: int, program: str, *args: object, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(mpi_command(ranks, program, *args), capture_output=True, text=True, env=ENV,
                          stdin=subprocess.DEVNULL, timeout=300)
    if check and proc.returncode:
        raise AssertionError(f"{program} on {ranks} ranks exited {proc.returncode}:\n{proc.stdout[-2000:]}\n"
                             f"{proc.stderr[-3000:]}")
    return proc


def arrays(dataset: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    directory = dataset / "arrays"
    return (np.load(directory / "src.npy"), np.load(directory / "dst.npy"),
            np.load(directory / "node_train_mask.npy").astype(bool))


def pair_cut(assignment: np.ndarray, src: np.ndarray, dst: np.ndarray) -> int:
    """Node pairs joined by an edge whose ends are in different parts: what both partitioners minimise."""
    low, high = np.divmod(leanpart.undirected_pairs(src, dst, len(assignment)), len(assignment))
    return int(np.count_nonzero(assignment[low] != assignment[high]))


@pytest.mark.parametrize("ranks, num_parts", [(2, 2), (4, 4), (2, 4)])
def test_assignment_covers_every_node_balanced_and_cuts_like_metis(synthetic_dataset, tmp_path, ranks, num_parts):
    out = tmp_path / "assignment"
    result = json.loads(mpirun(ranks, "mpiassign", "--dataset-dir", synthetic_dataset, "--out", out,
                               "--num-parts", num_parts).stdout.strip().splitlines()[-1])
    src, dst, train = arrays(synthetic_dataset)
    num_nodes = len(train)
    assignment = load_assignment(out)
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(assignment) == num_nodes and 0 <= assignment.min() and assignment.max() < num_parts
    assert manifest["slices"][0][0] == 0 and manifest["slices"][-1][1] == num_nodes and len(manifest["ranks"]) == ranks
    nodes = np.bincount(assignment, minlength=num_parts)
    assert nodes.max() <= (1 + manifest["imbalance"]) * num_nodes / num_parts + 1
    # The manifest's counts are the assignment's: owned nodes, their in-edges, their training nodes.
    edges = np.bincount(assignment[dst], minlength=num_parts)
    assert [[p["nodes"], p["edges"], p["train_nodes"]] for p in manifest["parts"]] == [
        [int(n), int(e), int(t)] for n, e, t in zip(nodes, edges, np.bincount(assignment[train], minlength=num_parts))]
    cut = pair_cut(assignment, src, dst)
    assert result["edge_cut"] == manifest["edge_cut"] and manifest["edge_cut"]["pairs"] == cut
    # The kit's METIS on the same graph, balancing node counts as PT-Scotch does here.
    metis_cut = pair_cut(leanpart.metis_parts([src.copy(), dst.copy()], num_nodes, None, num_parts, False), src, dst)
    assert cut <= 1.3 * metis_cut, (cut, metis_cut)
    assert cut < 0.5 * pair_cut(leanpart.random_parts(num_nodes, num_parts), src, dst)


def test_degree_weights_balance_in_edges(synthetic_dataset, tmp_path):
    out = tmp_path / "assignment"
    mpirun(2, "mpiassign", "--dataset-dir", synthetic_dataset, "--out", out, "--num-parts", 2, "--vertex-weight",
           "degree")
    _, dst, train = arrays(synthetic_dataset)
    assignment = load_assignment(out)
    nodes_and_edges = np.bincount(assignment, minlength=2) + np.bincount(assignment[dst], minlength=2)
    assert nodes_and_edges.max() <= 1.03 * nodes_and_edges.sum() / 2 + 1


def test_bad_input_fails_before_anything_is_written(tmp_path):
    proc = mpirun(2, "mpiassign", "--dataset-dir", tmp_path, "--out", tmp_path / "a", "--num-parts", 2, check=False)
    assert proc.returncode != 0 and "prepare --arrays" in proc.stderr and not (tmp_path / "a").exists()


def test_a_killed_rank_fails_the_run_and_leaves_nothing_to_trust(synthetic_dataset, tmp_path):
    """One rank killed while the ranks exchange edges (tiny rounds keep them at it for seconds): mpirun fails,
    no assignment directory appears, and a later run completes in spite of what the killed one left."""
    out = tmp_path / "assignment"
    args = ("--dataset-dir", synthetic_dataset, "--out", out, "--num-parts", 2)
    launcher = subprocess.Popen(mpi_command(2, "mpiassign", *args, "--batch-edges", 32), env=ENV,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    victim = exchanging_rank(launcher.pid)
    victim.send_signal(signal.SIGKILL)
    _, stderr = launcher.communicate(timeout=120)
    assert launcher.returncode != 0, stderr[-2000:]
    assert not out.exists()
    assert not (tmp_path / ".assignment.partial" / "manifest.json").exists()
    mpirun(2, "mpiassign", *args)
    assert len(load_assignment(out)) == len(np.load(synthetic_dataset / "arrays" / "node_labels.npy"))
    assert not (tmp_path / ".assignment.partial").exists()


def exchanging_rank(mpirun_pid: int) -> psutil.Process:
    """A rank of mpirun's that has mapped the edges, i.e. that has started the exchange rounds."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for child in psutil.Process(mpirun_pid).children(recursive=True):
            try:
                if any(m.path.endswith("/src.npy") for m in child.memory_maps()):
                    return child
            except psutil.NoSuchProcess:
                pass
        time.sleep(0.05)
    raise AssertionError("no rank mapped the edges within a minute")
