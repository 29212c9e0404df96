"""`dglkit launch` and `dglkit train` with real DGL servers and trainers on localhost."""

import json
import os
import signal
import socket
import time
from pathlib import Path

import dgl
import numpy as np
import psutil
import pytest
import torch

from dglkit.loop import to_original_order
from dglkit.sage import DistSAGE
from localjob import ENDLESS_TRAIN_ARGS, TRAIN_ARGS, assert_job_gone, free_ports, start_launch, start_local_job

NUM_CLASSES = 5


def read_metrics(job_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]


def wait_for_first_epoch(launch, log: Path) -> None:
    deadline = time.time() + 180
    while not (log.exists() and "val_acc" in log.read_text()):
        assert launch.poll() is None, f"launcher exited {launch.returncode} before the first epoch"
        assert time.time() < deadline, "no epoch within 180 s"
        time.sleep(0.3)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_local_graphbolt_run_trains_and_writes_outputs_in_original_order(finished_local_job, synthetic_dataset):
    job_dir = finished_local_job
    metrics = read_metrics(job_dir)
    assert metrics[0]["event"] == "start" and metrics[0]["num_trainers"] == 2 and metrics[0]["graphbolt"]
    epochs = [m for m in metrics if m["event"] == "epoch"]
    assert [m["epoch"] for m in epochs] == list(range(6))
    assert all(m["seeds_per_s"] > 0 and m["epoch_time"] > 0 and m["num_trainers"] == 2 for m in epochs)
    assert epochs[-1]["val_acc"] > 0.6, epochs  # chance is 0.2
    assert metrics[-1]["event"] == "test" and metrics[-1]["test_acc"] > 0.6
    status = json.loads((job_dir / "nodes/node0/status.json").read_text())
    assert status["state"] == "succeeded" and [p["returncode"] for p in status["processes"]] == [0, 0, 0, 0]
    logs = sorted(p.name for p in (job_dir / "nodes/node0").iterdir())
    assert logs == ["heartbeat-0", "heartbeat-1", "launcher.log", "server-0.log", "server-1.log", "status.json",
                    "trainer-0.log", "trainer-1.log"]
    assert (job_dir / "checkpoint.pt").is_file()
    assert "epoch 5:" in (job_dir / "nodes/node0/trainer-1.log").read_text()

    # The distributed outputs equal a single-process full-graph forward pass of the saved model, node by node.
    graph = dgl.load_graphs(str(synthetic_dataset / "graph.dgl"))[0][0]
    result = json.loads((job_dir / "result.json").read_text())
    # Outputs come from the best validation epoch's model; the final one is kept too.
    assert result["best_val_acc"] == max(m["val_acc"] for m in epochs) and result["best_test_acc"] > 0.6, result
    assert metrics[-1]["best_epoch"] == result["best_epoch"] and (job_dir / "model.pt").is_file()
    model = DistSAGE(result["in_feats"], 16, NUM_CLASSES, 2, 0.5)
    model.load_state_dict(torch.load(job_dir / "model-best.pt"))
    with torch.no_grad():
        hidden = torch.relu(model.layers[0](graph, graph.ndata["feat"]))
        logits = model.layers[1](graph, hidden)
    predictions, embeddings = np.load(job_dir / "predictions.npy"), np.load(job_dir / "embeddings.npy")
    assert embeddings.shape == (graph.num_nodes(), 16)
    np.testing.assert_allclose(embeddings, hidden.numpy(), rtol=1e-3, atol=1e-4)
    assert (predictions == logits.argmax(1).numpy()).mean() > 0.99
    assert (predictions == graph.ndata["labels"].numpy()).mean() > 0.6


def test_outputs_go_back_to_original_order_through_the_saved_mapping(partition_2, synthetic_dataset):
    """With 2 parts METIS renumbers nodes: the partitions' features, put back in order, equal the originals."""
    graph = dgl.load_graphs(str(synthetic_dataset / "graph.dgl"))[0][0]
    parts = [dgl.data.utils.load_tensors(str(partition_2.parent / f"part{i}/node_feat.dgl")) for i in range(2)]
    partitioned = np.concatenate([part["_N/feat"].numpy() for part in parts])
    orig_nids = np.load(partition_2.parent / "orig_nids.npy")
    assert not (orig_nids == np.arange(len(orig_nids))).all()
    np.testing.assert_array_equal(to_original_order(partitioned, orig_nids), graph.ndata["feat"].numpy())


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_distributed_run_from_job_json(partition_1, tmp_path):
    """DGL-format partition, an explicit ip_config and job.json (the way the kit starts a job)."""
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    base = free_ports(3)
    (job_dir / "ip_config.txt").write_text(f"127.0.0.1 {base}\n")
    config = {"ip_config": str(job_dir / "ip_config.txt"), "part_config": str(partition_1), "num_servers": 2,
              "num_trainers": 2, "master_port": base + 2, "node_name": "n1", "train_args": TRAIN_ARGS}
    (job_dir / "job.json").write_text(json.dumps(config))
    shm_before = set(os.listdir("/dev/shm"))
    launch = start_launch(job_dir, "--config", job_dir / "job.json")
    assert launch.wait(timeout=240) == 0, (job_dir / "launch.out").read_text()[-3000:]
    last = json.loads((job_dir / "launch.out").read_text().splitlines()[-1])
    assert last == {"changed": True, "node": "n1", "state": "succeeded", "reason": ""}
    metrics = read_metrics(job_dir)
    assert not metrics[0]["graphbolt"] and metrics[-2]["val_acc"] > 0.6 and metrics[-1]["event"] == "test"
    assert_job_gone(job_dir, [base, base + 1, base + 2], shm_before)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("victim", ["server-1", "trainer-1"])
def test_killed_process_stops_the_job_and_leaves_nothing(victim, partition_1, tmp_path):
    job_dir = tmp_path / "job"
    shm_before = set(os.listdir("/dev/shm"))
    # server-1 is a backup server: its end stops the job as the main server's would.
    launch, ports = start_local_job(job_dir, partition_1, "n1", "--grace", 5, train_args=ENDLESS_TRAIN_ARGS,
                                    servers=2)
    node_dir = job_dir / "nodes/n1"
    wait_for_first_epoch(launch, node_dir / "trainer-1.log")
    processes = {p["name"]: p["pid"] for p in json.loads((node_dir / "status.json").read_text())["processes"]}
    os.kill(processes[victim], signal.SIGKILL)
    killed = time.time()

    assert launch.wait(timeout=60) == 1
    assert time.time() - killed < 30
    out = (job_dir / "launch.out").read_text()
    assert f"FAILED: {victim}: exited with signal SIGKILL" in out
    failed = json.loads((job_dir / "FAILED").read_text())
    assert failed["node"] == "n1" and failed["process"] == victim and failed["exit_code"] == -9
    assert failed["log"].endswith(f"{victim}.log") and failed["log_tail"]
    status = json.loads((node_dir / "status.json").read_text())
    assert status["state"] == "failed" and victim in status["reason"]
    assert_job_gone(job_dir, ports, shm_before)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_signalled_launcher_stops_its_job_and_exits_128_plus_the_signal(partition_1, tmp_path):
    """What systemd's stop of the job unit does to a launcher: an orderly stop, no FAILED, exit 143."""
    job_dir = tmp_path / "job"
    shm_before = set(os.listdir("/dev/shm"))
    launch, ports = start_local_job(job_dir, partition_1, "n1", "--grace", 5, train_args=ENDLESS_TRAIN_ARGS)
    wait_for_first_epoch(launch, job_dir / "nodes/n1/trainer-0.log")
    launch.send_signal(signal.SIGTERM)

    assert launch.wait(timeout=60) == 128 + signal.SIGTERM
    assert not (job_dir / "FAILED").exists()
    status = json.loads((job_dir / "nodes/n1/status.json").read_text())
    assert status["state"] == "stopped" and "SIGTERM" in status["reason"], status
    assert_job_gone(job_dir, ports, shm_before)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_stalled_trainer_stops_the_job(partition_1, tmp_path):
    """A frozen trainer (SIGSTOP) blocks its peer in all-reduce forever: only the stall detector ends that."""
    job_dir = tmp_path / "job"
    shm_before = set(os.listdir("/dev/shm"))
    launch, ports = start_local_job(job_dir, partition_1, "n1", "--stall-timeout", 10, "--grace", 3,
                                    train_args=ENDLESS_TRAIN_ARGS)
    node_dir = job_dir / "nodes/n1"
    wait_for_first_epoch(launch, node_dir / "trainer-0.log")
    for process in json.loads((node_dir / "status.json").read_text())["processes"]:
        if process["name"].startswith("trainer-"):
            psutil.Process(process["pid"]).suspend()
    stopped = time.time()

    assert launch.wait(timeout=60) == 1
    assert 10 <= time.time() - stopped < 30
    failed = json.loads((job_dir / "FAILED").read_text())
    assert failed["process"].startswith("trainer-") and "heartbeat did not change for 10 s" in failed["reason"]
    assert_job_gone(job_dir, ports, shm_before)


@pytest.fixture
def held_port():
    """A port some other program listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", free_ports(1)))
        sock.listen()
        yield sock.getsockname()[1]


def test_port_in_use_is_a_clear_error_and_starts_nothing(cli, partition_1, tmp_path, held_port):
    code, _, err = cli("launch", "--local", "--job-dir", tmp_path / "job", "--part-config", partition_1,
                       "--server-port", held_port, "--master-port", free_ports(1))
    assert code == 2
    assert f"port {held_port} on 127.0.0.1 (DGL server 0) is not free" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "job").exists()


def test_master_port_in_use_is_a_clear_error(cli, partition_1, tmp_path, held_port):
    code, _, err = cli("launch", "--local", "--job-dir", tmp_path / "job", "--part-config", partition_1,
                       "--server-port", free_ports(2), "--master-port", held_port)
    assert code == 2 and "torch.distributed master port" in err
    assert not (tmp_path / "job").exists()


def test_partition_for_another_number_of_machines_is_refused(cli, partition_2, tmp_path):
    code, _, err = cli("launch", "--local", "--job-dir", tmp_path / "job", "--part-config", partition_2)
    assert code == 2
    assert "has 2 partitions but" in err and "lists 1 machines" in err
    assert not (tmp_path / "job").exists()


def test_missing_partition_config_is_refused(cli, tmp_path):
    code, _, err = cli("launch", "--local", "--job-dir", tmp_path / "job", "--part-config", tmp_path / "nope.json")
    assert code == 2 and "nope.json not found" in err


def test_node_not_in_ip_config_is_refused(cli, partition_1, tmp_path):
    # A documentation address (TEST-NET-3): never a local interface, and nothing is sent to it.
    (tmp_path / "ip_config.txt").write_text("203.0.113.7 30050\n")
    code, _, err = cli("launch", "--ip-config", tmp_path / "ip_config.txt", "--job-dir", tmp_path / "job",
                       "--part-config", partition_1)
    assert code == 2 and "is in" in err and "--machine-id" in err


def test_job_json_with_an_unknown_key_is_refused(cli, tmp_path):
    (tmp_path / "job.json").write_text(json.dumps({"num_trainer": 2}))
    code, _, err = cli("launch", "--config", tmp_path / "job.json")
    assert code == 2 and "unknown keys ['num_trainer']" in err


def test_flags_override_job_json(tmp_path):
    import argparse

    from dglkit.launcher import options

    (tmp_path / "job.json").write_text(json.dumps({"num_trainers": 4, "train_args": ["--lr", "0.1"]}))
    parser = argparse.ArgumentParser()
    options.add_arguments(parser)
    cfg = options.settings(parser.parse_args(["--config", str(tmp_path / "job.json"), "--num-trainers", "2"]))
    assert cfg.num_trainers == 2 and cfg.train_args == ["--lr", "0.1"] and cfg.job_dir == str(tmp_path)
    assert cfg.trainer_threads == max((os.cpu_count() or 1) // 2 // 2, 1)


def test_train_refuses_a_partition_without_graphbolt(cli, partition_1, tmp_path):
    (tmp_path / "ip_config.txt").write_text("127.0.0.1 30050\n")
    code, _, err = cli("train", "--ip-config", tmp_path / "ip_config.txt", "--part-config", partition_1,
                       "--graphbolt")
    assert code == 2 and "no GraphBolt graph" in err
