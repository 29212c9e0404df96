"""The built-in tasks through playbooks/train.yml on the training cluster (node1 storage, node2 and node3
workers; conftest.train_cluster, shared with test_own_programs and test_train): RGCN on the synthetic
heterogeneous graph, and link prediction on the synthetic graph, each on 2 workers with summary and curves in
runs/<job id>/. The tests share the cluster and run in file order.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from jobhelpers import assert_clean, flat, run_folder, train
from test_train import runs, site  # noqa: F401 (the training cluster's fixtures)

if TYPE_CHECKING:
    from conftest import Cluster

RANDOM_RANKER_MRR = sum(1 / rank for rank in range(1, 102)) / 101  # rank uniform over 1 + 100 negatives


def results(folder: Path) -> tuple[dict, dict, list[dict]]:
    """result.json, summary.json and the epoch events of a fetched run folder, after checking its files."""
    assert {"job.json", "metrics.jsonl", "result.json", "summary.json", "summary.txt", "curves.png"} <= \
        {p.name for p in folder.iterdir()}
    events = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return (json.loads((folder / "result.json").read_text()), json.loads((folder / "summary.json").read_text()),
            [event for event in events if event["event"] == "epoch"])


def test_rgcn_on_a_heterogeneous_graph(site: Cluster, runs: Path) -> None:
    run = train(site, runs, "-e", "dgl_job_dataset=synthetic-hetero", "-e", "dgl_job_synthetic_nodes=6000",
                "-e", "dgl_job_synthetic_classes=5", "-e", "dgl_job_epochs=4", "-e", "dgl_job_batch_size=100",
                "-e", "dgl_job_save_predictions=true")
    folder = run_folder(run.output)
    result, summary, epochs = results(folder)
    assert result["num_trainers"] == 2 and result["category"] == "paper", result
    assert result["featureless_types"] == ["author", "field_of_study", "institution"]
    assert result["best_test_acc"] > 0.5, result  # chance: 0.2
    assert summary["task"] == "node_classification" and summary["best_test_acc"] == result["best_test_acc"]
    assert len(epochs) == 4 and "test accuracy" in (folder / "summary.txt").read_text()
    assert (folder / "predictions.npy").is_file()
    # The partition holds the per-type ID mappings.
    (manifest_path,) = (site.workspace / "partitions").glob("synthetic-hetero-*-2p/manifest.json")
    manifest = json.loads(manifest_path.read_text())
    assert len(manifest["parts"]) == 2 and all(part["train_nodes"] > 0 for part in manifest["parts"])
    assert_clean(site)


# test_contacts.py runs it again once it has finished here (its count of a finished job's re-run).
LINK_PREDICTION = ["-e", "dgl_job_task=link_prediction", "-e", "dgl_job_synthetic_nodes=6000",
                   "-e", "dgl_job_synthetic_classes=30", "-e", "dgl_job_epochs=4", "-e", "dgl_job_batch_size=500",
                   "-e", "dgl_job_dropout=0", "-e", "dgl_job_lr=0.01"]


def test_link_prediction(site: Cluster, runs: Path) -> None:
    run = train(site, runs, *LINK_PREDICTION)
    assert "val_mrr" in flat(run.output), run.output[-3000:]  # the progress lines show the task's metric
    folder = run_folder(run.output)
    result, summary, epochs = results(folder)
    assert result["num_trainers"] == 2 and result["task"] == "link_prediction", result
    assert result["best_test_mrr"] > 2 * RANDOM_RANKER_MRR, (result, RANDOM_RANKER_MRR)
    assert summary["metric"] == "mrr" and len(epochs) == 4 and "test MRR" in (folder / "summary.txt").read_text()
    assert_clean(site)


def test_link_prediction_on_a_heterogeneous_graph_fails_before_anything_runs(site: Cluster, runs: Path) -> None:
    run = train(site, runs, "-e", "dgl_job_task=link_prediction", "-e", "dgl_job_dataset=synthetic-hetero",
                check=False)
    assert run.returncode != 0 and "runs on homogeneous graphs" in flat(run.output), run.output[-3000:]
