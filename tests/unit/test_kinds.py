"""Dataset kinds and "heterogeneous?": decided by the name where it can be (dglkit plan on the controller), by the
partition where only the data tell (a files dataset), and refused by `dglkit launch --check` before anything starts."""
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from dglkit import kinds, train
from localjob import build


def test_the_name_decides_where_it_can() -> None:
    assert [kinds.heterogeneous(name) for name in ("synthetic", "synthetic-hetero", "ogbn-products", "ogbn-mag")] \
        == [False, True, False, True]
    assert kinds.heterogeneous("files") is None and kinds.kind("files") == kinds.FILES
    assert kinds.kind("products") is None and kinds.kind("ogbn-") is None


def test_the_trainer_modules_are_the_table_of_tasks() -> None:
    assert set(train.TASK_MODULES) == set(kinds.TASKS)
    assert {module.__name__ for module in train.TASK_MODULES.values()} == \
        {f"dglkit.{name}" for name in kinds.TASKS.values()}


@pytest.fixture(scope="module")
def hetero_files_partition(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A heterogeneous graph given as files (num_nodes.json), prepared and partitioned in one part."""
    files = tmp_path_factory.mktemp("files") / "graph"
    rng = np.random.default_rng(0)
    (files / "nodes/paper").mkdir(parents=True)
    (files / "edges").mkdir()
    (files / "num_nodes.json").write_text(json.dumps({"paper": 60, "author": 40}))
    np.save(files / "nodes/paper/feat.npy", rng.random((60, 4), dtype=np.float32))
    np.save(files / "nodes/paper/labels.npy", np.arange(60) % 3)
    np.save(files / "edges/author___writes___paper.npy", np.stack([rng.integers(0, 40, 200), rng.integers(0, 60, 200)], 1))
    np.save(files / "edges/paper___cites___paper.npy", np.stack([rng.integers(0, 60, 200), rng.integers(0, 60, 200)], 1))
    dataset, out = files.parent / "dataset", files.parent / "part"
    build("prepare", "--dataset", "files", "--path", files, "--out", dataset)
    build("partition", "--dataset-dir", dataset, "--out", out, "--num-parts", 1, "--graph-name", "mine")
    return out / "mine.json"


def test_launch_check_refuses_a_homogeneous_only_task_on_a_heterogeneous_files_partition(
        hetero_files_partition: Path, tmp_path: Path, cli: Callable) -> None:
    job = tmp_path / "job.json"
    config = {"part_config": str(hetero_files_partition), "local": True, "server_port": 30990, "master_port": 30991,
              "train_args": ["--settings", str(job)]}
    job.write_text(json.dumps({**config, "train": {"task": "link_prediction"}}))
    code, _, err = cli("launch", "--config", job, "--check")
    assert code == 2
    assert err == (f"dglkit launch: error: {hetero_files_partition} is a heterogeneous graph: --task link_prediction "
                   "does not run on it; use --task node_classification")
    job.write_text(json.dumps({**config, "train": {"task": "node_classification"}}))
    assert cli("launch", "--config", job, "--check")[0] == 0
    assert not (tmp_path / "nodes").exists()  # a check starts nothing
