"""dglkit plan: every rule of the job settings, the ids as the kit derived them before, job.json, the CLI."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from dglkit import plan

REPO = Path(__file__).resolve().parents[2]
# Recorded from the Ansible derivation that plan.py replaced (roles/dgl_job/tasks/ids.yml and
# templates/job.json.j2 at commit 5680585), for 23 settings cases on 2 and 3 workers: ids of jobs that ran
# before must not change.
RECORDED = json.loads((REPO / "tests/unit/data/ids_before.json").read_text())
PARTITION = {"id": "synthetic-1906b74ef6-2p", "slug": "synthetic",
             "part_config": "/srv/dglkit/partitions/synthetic-1906b74ef6-2p/synthetic.json"}
PROGRAM = {"id": "p-0123456789ab", "dir": "/srv/dglkit/programs/p-0123456789ab", "python_env": "/v",
           "command": "python3 p.py"}


def planned(**settings) -> dict:
    return plan.plan({"settings": {f"dgl_job_{k}": v for k, v in settings.items()}, "workers": ["node2", "node3"],
                      "partition": PARTITION})


def errors(**settings) -> str:
    return "; ".join(planned(**settings)["errors"])


@pytest.mark.parametrize("case", sorted(RECORDED))
def test_ids_and_files_are_the_ones_ansible_derived(case: str) -> None:
    record = RECORDED[case]
    out = plan.plan({"settings": {f"dgl_job_{k[8:]}": v for k, v in record["overrides"].items()},
                     "workers": record["workers"],
                     "partition": {"id": record["partition"], "slug": record["slug"],
                                   "part_config": record["part_config"]}})
    assert out["errors"] == []
    assert (out["job_id"], out["job_dir"]) == (record["job"], record["dir"])
    assert out["settings"] == record["settings"]
    config, recorded = dict(out["config"]), json.loads(record["job_json"])
    # The trainer's command line became job.json's "train" (test_the_trainer_reads_what_its_command_line_said).
    assert config.pop("train_args") == (["--settings", f"{record['dir']}/job.json"] if recorded["train_args"] else [])
    config.pop("train")
    recorded.pop("train_args")
    assert config == recorded
    assert json.dumps(out["run_settings"], indent=4, sort_keys=True) == record["settings_json"].rstrip("\n")


def test_values_given_as_strings_are_the_same_job() -> None:
    # -e key=value hands every value over as a string.
    assert planned(epochs="5", fan_out="10, 25", lr="0.01", graphbolt="false")["job_id"] == planned()["job_id"]
    assert planned(graphbolt="yes")["settings"]["graphbolt"] is True


@pytest.mark.parametrize("settings, message", [
    ({"epochs": "many"}, "dgl_job_epochs=many: use a value of type int"),
    ({"graphbolt": "maybe"}, "dgl_job_graphbolt=maybe: use a value of type bool"),
    ({"fan_out": "10,lots"}, "dgl_job_fan_out=10,lots: use a value of type list"),
    ({"node_data_names": "feat"}, "dgl_job_node_data_names=feat: use a value of type dict"),
    ({"task": "regression"}, "value of dgl_job_task must be one of: node_classification, link_prediction, got: regression"),
    ({"partition_builder": "metis"},
     "value of dgl_job_partition_builder must be one of: lean, dgl, distributed, mpi, got: metis"),
    ({"partition_builder": "mpi", "mpi": True},
     "dgl_job_partition_builder=mpi runs mpirun across the workers: set dglkit_ssh_mesh: true in the inventory and run "
     "site.yml"),
    ({"partition_builder": "mpi", "ssh_mesh": True}, "set dglkit_mpi: true in the inventory"),
    ({"partition_builder": "mpi"}, "set dglkit_mpi: true and dglkit_ssh_mesh: true in the inventory"),
    ({"partition_builder": "mpi", "mpi": True, "ssh_mesh": True, "dataset": "ogbn-mag"},
     "dgl_job_partition_builder=mpi reads a heterogeneous graph in DGL's chunked format only; ogbn-mag is "
     "heterogeneous"),
    ({"dataset": "products"}, "dgl_job_dataset=products: use synthetic, synthetic-hetero, files, chunked or an ogbn-* "
                              "name such as ogbn-products or ogbn-mag"),
    ({"task": "link_prediction", "dataset": "synthetic-hetero"},
     "dgl_job_task=link_prediction runs on homogeneous graphs; synthetic-hetero is heterogeneous (use "
     "dgl_job_task=node_classification, which trains RGCN on it)"),
    ({"task": "link_prediction", "dataset": "ogbn-mag"}, "ogbn-mag is heterogeneous"),
    ({"graphbolt": True, "dataset": "ogbn-mag"},
     "dgl_job_graphbolt=true: the RGCN trainer of heterogeneous graphs samples with DGL's own sampler"),
    ({"task": "link_prediction", "graphbolt": "true"},
     "dgl_job_task=link_prediction with dgl_job_graphbolt=true: DGL 2.1's GraphBolt samples nodes only, not the "
     "edges link prediction trains on (find_edges is not supported in GraphBolt); set dgl_job_graphbolt=false"),
    ({"weight_decay": -0.1}, "dgl_job_weight_decay=-0.1: use a value >= 0"),
    ({"sparse_lr": 0}, "dgl_job_sparse_lr=0: use a value > 0"),
    ({"eval_negs": 0}, "dgl_job_eval_negs=0: use a value >= 1"),
    ({"task": "link_prediction", "dataset": "chunked", "chunked_path": "/srv/dglkit/graphs/g"},
     "dgl_job_task=link_prediction holds validation and test edges out of the whole graph, which the kit never reads "
     "on one host in DGL's chunked format"),
    ({"task": "link_prediction", "partition_builder": "mpi", "mpi": True, "ssh_mesh": True},
     "(dgl_job_dataset=chunked, or synthetic with dgl_job_partition_builder=mpi): use dgl_job_task=node_classification"),
    ({"task": "link_prediction", "link_val_frac": 0.5, "link_test_frac": 0.5},
     "dgl_job_link_val_frac and dgl_job_link_test_frac must have a sum < 1"),
    ({"task": "link_prediction", "link_test_frac": 0}, "dgl_job_link_test_frac=0: use a value > 0 and < 1"),
    ({"dataset": "files"}, "dgl_job_dataset=files needs dgl_job_files_path (a .npz file or a directory on the "
                           "storage host)"),
    ({"dataset": "chunked"}, "dgl_job_dataset=chunked needs dgl_job_chunked_path (the directory of its metadata.json"),
    ({"id": "../elsewhere"}, "dgl_job_id=../elsewhere: use letters, digits, ., _ and - only, starting with a letter "
                             "or digit (it names a directory)"),
    ({"id": ".."}, "dgl_job_id=..: '.' and '..' are not names (it names a directory)"),
    ({"fan_out": [5, 10, 15]}, "dgl_job_fan_out=5,10,15: needs 2 values, one per layer (dgl_job_layers=2)"),
    ({"fan_out": [0, -1]}, "dgl_job_fan_out=0,-1: use values >= 1, or -1 for all neighbours"),
    ({"trainers": 0, "epochs": 0}, "dgl_job_epochs=0: use a value >= 1; dgl_job_trainers=0: use a value >= 1"),
    ({"samplers": -1}, "dgl_job_samplers=-1: use a value >= 0"),
    ({"dropout": 1.5}, "dgl_job_dropout=1.5: use a value >= 0 and < 1"),
    ({"lr": "0"}, "dgl_job_lr=0: use a value > 0"),
    ({"stall_timeout": 5}, "dgl_job_stall_timeout=5: use a value >= 10"),
    ({"poll_seconds": 0}, "dgl_job_poll_seconds=0: use a value >= 1"),
    ({"progress_seconds": -1}, "dgl_job_progress_seconds=-1: use a value >= 0"),
    ({"restart_wait": 5}, "dgl_job_restart_wait=5: use a value >= 10"),
    ({"checkpoint_every": -1}, "dgl_job_checkpoint_every=-1: use a value >= 0"),
    ({"memory_max": "8GB"}, "dgl_job_memory_max=8GB: use bytes with K, M, G or T (e.g. 48G), a percentage of the "
                            "node's memory (80%), or empty"),
    ({"cpu_quota": 2}, "dgl_job_cpu_quota=2: use a percentage of one core (400% = four cores), or empty"),
    ({"node_data_names": {"feat": "features"}},
     "dgl_job_node_data_names names node data for your own program: set dgl_program_dir and dgl_program_command too "
     "(the kit's trainer reads the kit's names)"),
    ({"node_data_names": {"feat": ["features"]}, "program": PROGRAM},
     "dgl_job_node_data_names={\"feat\": [\"features\"]}: map a node data name to the name your program reads "
     "({feat: features}), or a node type to such a mapping ({paper: {feat: features}})"),
    ({"master_port": 30051, "servers": 2}, "dgl_job_master_port=30051 collides with the DGL server ports: pick another "
                                           "port"),
])
def test_each_bad_setting_is_refused_with_what_to_fix(settings: dict, message: str) -> None:
    assert message in errors(**settings)


def test_every_error_is_reported_at_once_and_nothing_else() -> None:
    out = planned(dropout=2, lr=-1, dataset="files")
    assert out == {"errors": ["dgl_job_dropout=2: use a value >= 0 and < 1", "dgl_job_lr=-1: use a value > 0",
                              "dgl_job_dataset=files needs dgl_job_files_path (a .npz file or a directory on the "
                              "storage host)"]}


def test_good_settings_pass() -> None:
    for settings in ({}, {"dataset": "ogbn-products", "task": "link_prediction"}, {"dataset": "ogbn-products", "graphbolt": True},
                     {"dataset": "files", "files_path": "/g.npz", "task": "link_prediction"},
                     {"memory_max": "80%", "cpu_quota": "400%", "fan_out": [-1, 5]},
                     {"node_data_names": {"paper": {"feat": "features"}}, "program": PROGRAM},
                     {"partition_builder": "mpi", "mpi": True, "ssh_mesh": True},
                     {"partition_builder": "mpi", "mpi": True, "ssh_mesh": True, "dataset": "synthetic-hetero"}):
        assert planned(**settings)["errors"] == [], settings


def test_a_program_replaces_the_trainer_in_job_json() -> None:
    out = planned(program=PROGRAM, node_data_names={"feat": "features"})
    assert out["job_id"].startswith("p-synthetic-2w-")
    config = out["config"]
    assert (config["command"], config["program_dir"], config["python_env"]) == ("python3 p.py", PROGRAM["dir"], "/v")
    assert config["train_args"] == [] and config["node_data_names"] == {"feat": "features"}
    assert out["run_settings"]["node_data_names"] == {"feat": "features"}


def test_the_command_runs_with_the_standard_library_alone() -> None:
    # -S: no site-packages, as on a controller whose Python has Ansible and nothing else.
    request = {"settings": {"dgl_job_epochs": "7"}, "workers": ["a"], "partition": PARTITION}
    proc = subprocess.run([sys.executable, "-S", "-m", "dglkit", "plan", "--request", json.dumps(request)],
                          env={"PYTHONPATH": str(REPO / "app")}, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["errors"] == [] and out["settings"]["epochs"] == 7 and out["job_id"].startswith("synthetic-1w-")


def test_the_trainer_reads_what_its_command_line_said(tmp_path: Path) -> None:
    import argparse

    from dglkit import train

    parser = argparse.ArgumentParser()
    train.add_arguments(parser)
    required = ["--ip-config", "x", "--part-config", "y"]
    for case, record in RECORDED.items():
        train_args = json.loads(record["job_json"])["train_args"]
        if not train_args:
            continue
        out = plan.plan({"settings": {f"dgl_job_{k[8:]}": v for k, v in record["overrides"].items()},
                         "workers": record["workers"], "partition": {"id": record["partition"], "slug": "s",
                                                                     "part_config": "p"}})
        (tmp_path / "job.json").write_text(json.dumps(out["config"]))
        from_file = parser.parse_args([*required, "--settings", str(tmp_path / "job.json")])
        # "--fan-out=-1,5": as two words argparse took -1,5 for an option (the command line's old bug).
        i = train_args.index("--fan-out")
        train_args[i:i + 2] = [f"--fan-out={train_args[i + 1]}"]
        from_args = parser.parse_args([*required, *train_args])
        assert vars(from_file) == {**vars(from_args), "settings": str(tmp_path / "job.json")}, case
    # Options after --settings override it, as local runs and tests give them.
    assert parser.parse_args([*required, "--settings", str(tmp_path / "job.json"), "--lr", "0.5"]).lr == 0.5


def test_the_trainer_defaults_are_the_declared_ones() -> None:
    import argparse

    from dglkit import settings, train

    parser = argparse.ArgumentParser()
    train.add_arguments(parser)
    args = parser.parse_args(["--ip-config", "x", "--part-config", "y"])
    for setting in settings.SETTINGS.values():
        if setting.reader == settings.TRAINER:
            assert getattr(args, setting.dest) == setting.train_value(setting.default), setting.name
    assert set(settings.SETTINGS["task"].choices) == {task for task, _ in train.TASK_MODULES}


def test_plan_trainer_and_launcher_apply_the_same_declared_checks(cli, partition_1, tmp_path) -> None:
    """One rule per setting (dglkit.settings): what plan refuses in dgl_job_*, the trainer and the launcher refuse
    in their flags, with the same advice."""
    assert "dgl_job_stall_timeout=5: use a value >= 10" in errors(stall_timeout=5)
    code, _, err = cli("launch", "--job-dir", tmp_path / "job", "--local", "--part-config", partition_1,
                       "--stall-timeout", 5)
    assert code == 2 and "--stall-timeout 5: use a value >= 10 (job setting dgl_job_stall_timeout)" in err, err
    assert "dgl_job_master_port=70000: use a value >= 1 and <= 65535" in errors(master_port=70000)
    code, _, err = cli("launch", "--job-dir", tmp_path / "job", "--local", "--part-config", partition_1,
                       "--master-port", 70000)
    assert code == 2 and "--master-port 70000: use a value >= 1 and <= 65535" in err, err
    ip_config = tmp_path / "ip_config.txt"
    ip_config.write_text("127.0.0.1 30050\n")
    assert "dgl_job_epochs=0: use a value >= 1" in errors(epochs=0)
    code, _, err = cli("train", "--ip-config", ip_config, "--part-config", partition_1, "--num-epochs", 0)
    assert code == 2 and "--num-epochs 0: use a value >= 1" in err, err
    assert "dgl_job_fan_out=5,10,15: needs 2 values, one per layer" in errors(fan_out=[5, 10, 15])
    code, _, err = cli("train", "--ip-config", ip_config, "--part-config", partition_1, "--fan-out", "5,10,15")
    assert code == 2 and "--fan-out 5,10,15: needs 2 values, one per layer (--num-layers 2)" in err, err
