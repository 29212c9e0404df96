"""roles/dgl_job without hosts: id derivation, job.json rendering and the rejection of bad settings.

One real ansible-playbook run (tests/kit/job_role.yml) against an inventory whose hosts are all local
connections; the play prints records through debug (no module runs on a host) that the JSON callback hands us.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> dict:
    inventory = tmp_path_factory.mktemp("inventory") / "hosts.yml"
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory.write_text(yaml.safe_dump({"all": {"children": {"cluster": {"vars": local, "children": {
        "storage": {"hosts": {"node1": {"ansible_host": "10.9.0.11"}}},
        "workers": {"hosts": {"node2": {"ansible_host": "10.9.0.12"},
                              "node3": {"ansible_host": "10.9.0.13", "dglkit_cluster_address": "10.8.0.13"}}},
    }}}}}))
    env = {**os.environ, "ANSIBLE_STDOUT_CALLBACK": "json", "ANSIBLE_NOCOLOR": "1"}
    # A program whose directory links out of itself (data, secret) and inside itself (latest.py).
    linked = tmp_path_factory.mktemp("linked") / "project"
    linked.mkdir()
    (linked / "train.py").write_text("print('training')\n")
    (linked.parent / "secret").write_text("not the program's\n")
    (linked / "data").symlink_to("/etc")
    (linked / "secret").symlink_to(linked.parent / "secret")
    (linked / "latest.py").symlink_to("train.py")
    proc = subprocess.run([BIN / "ansible-playbook", "-i", inventory, "tests/kit/job_role.yml", "-e", f"repo={REPO}",
                           "-e", f"linked_program={linked}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    found = {}
    for play in json.loads(proc.stdout)["plays"]:
        for task in play["tasks"]:
            for result in task["hosts"].values():
                msg = result.get("msg")
                if isinstance(msg, dict) and "record" in msg:
                    found[msg["record"]] = msg["value"]
    return found


def ids(records: dict, case: str) -> dict:
    return records[f"ids-{case}"]


def test_same_settings_give_the_same_ids(records: dict) -> None:
    # -e key=value hands every value over as a string: it must not count as another job.
    defaults, strings = ids(records, "defaults"), ids(records, "strings")
    assert (defaults["dataset"], defaults["partition"], defaults["job"]) == \
           (strings["dataset"], strings["partition"], strings["job"])
    assert defaults["job"].startswith("synthetic-2w-")
    assert defaults["partition"] == defaults["dataset"] + "-2p"
    assert defaults["dir"] == f"/srv/dglkit/jobs/{defaults['job']}"


def test_training_settings_change_the_job_but_not_the_partition(records: dict) -> None:
    defaults = ids(records, "defaults")
    for case in ("epochs", "graphbolt", "seed"):
        other = ids(records, case)
        assert other["partition"] == defaults["partition"], case
        assert other["job"] != defaults["job"], case


def test_dataset_settings_change_dataset_partition_and_job(records: dict) -> None:
    defaults, bigger = ids(records, "defaults"), ids(records, "nodes")
    assert bigger["dataset"] != defaults["dataset"]
    assert bigger["partition"] != defaults["partition"]
    assert bigger["job"] != defaults["job"]


def test_a_chunked_graph_is_identified_by_its_path(records: dict) -> None:
    first, other = ids(records, "chunked"), ids(records, "chunked-other")
    assert first["dataset"].startswith("chunked-") and first["job"].startswith("chunked-2w-")
    assert other["dataset"] != first["dataset"] and other["partition"] != first["partition"]


def test_the_partition_builder_gives_its_own_partition_and_job(records: dict) -> None:
    defaults, builder = ids(records, "defaults"), ids(records, "builder")
    assert builder["dataset"] == defaults["dataset"]
    assert builder["partition"] == defaults["partition"] + "-dgl" and builder["job"] != defaults["job"]


def test_the_mpi_builders_synthetic_graphs_are_datasets_of_their_own(records: dict) -> None:
    """Written chunk by chunk on the workers by the chunked generator: other graphs than the whole ones of the same
    settings. A user's chunked graph is described where it is for the mpi builder and read whole for the others:
    two datasets."""
    for whole, chunked in (("defaults", "builder-mpi"), ("hetero", "hetero-mpi")):
        assert not ids(records, whole)["on_workers"] and ids(records, chunked)["on_workers"], whole
        assert ids(records, chunked)["dataset"] != ids(records, whole)["dataset"]
        assert ids(records, chunked)["partition"] == ids(records, chunked)["dataset"] + "-2p-mpi"
    assert ids(records, "hetero-mpi")["dataset"].startswith("synthetic-hetero-")
    described, read_whole = ids(records, "chunked-mpi"), ids(records, "chunked")
    assert not described["on_workers"] and described["dataset"] != read_whole["dataset"]


def test_link_prediction_gets_a_dataset_of_its_own(records: dict) -> None:
    defaults, links = ids(records, "defaults"), ids(records, "link-prediction")
    assert links["dataset"] != defaults["dataset"] and links["job"] != defaults["job"]
    assert links["job_json"]["train"]["task"] == "link_prediction"


def test_an_added_worker_gives_a_new_partition_and_job(records: dict) -> None:
    defaults, resized = ids(records, "defaults"), ids(records, "resized")
    assert resized["dataset"] == defaults["dataset"]
    assert resized["partition"] == defaults["dataset"] + "-3p"
    assert resized["job"].startswith("synthetic-3w-") and resized["job"] != defaults["job"]
    assert resized["nodes"] == ["node2", "node3", "node4"]


def test_a_job_id_set_by_the_user_is_kept(records: dict) -> None:
    named = ids(records, "named")
    assert named["job"] == "my-job.1" and named["dir"] == "/srv/dglkit/jobs/my-job.1"


def test_job_json_is_what_the_launcher_and_trainer_accept(records: dict, tmp_path: Path) -> None:
    from dglkit import train
    from dglkit.launcher import options

    defaults = ids(records, "defaults")
    config = tmp_path / "job.json"
    config.write_text(json.dumps(defaults["job_json"]))
    parser = argparse.ArgumentParser()
    options.add_arguments(parser)
    cfg = options.settings(parser.parse_args(["--config", str(config), "--node-name", "node2"]))
    assert cfg.job_dir == defaults["dir"]
    assert cfg.ip_config == "/srv/dglkit/ip_config.txt"
    assert cfg.part_config == f"/srv/dglkit/partitions/{defaults['partition']}/synthetic.json"
    assert (cfg.num_servers, cfg.num_trainers, cfg.num_samplers, cfg.master_port) == (1, 1, 0, 29500)
    assert cfg.trainer_threads >= 1  # 0 in the settings: the launcher picks
    # The trainer reads its settings from job.json itself (the file at the job directory on the nodes).
    assert cfg.train_args == ["--settings", f"{defaults['dir']}/job.json"]
    parser = argparse.ArgumentParser()
    train.add_arguments(parser)
    args = parser.parse_args(["--ip-config", "x", "--part-config", "y", "--settings", str(config)])
    assert (args.num_epochs, args.fan_out, args.num_layers, args.num_hidden) == (5, "10,25", 2, 64)
    assert (args.lr, args.dropout, args.graphbolt, args.save_embeddings) == (0.01, 0.5, False, False)
    assert (args.task, args.weight_decay, args.seed, args.sparse_lr) == ("node_classification", 0.0, 0, 0.01)
    assert (args.num_negs, args.eval_negs, args.checkpoint_every) == (5, 100, 1)
    assert ids(records, "graphbolt")["job_json"]["train"]["graphbolt"] is True and not args.graphbolt


def test_a_user_program_has_its_own_job_id_and_command_in_job_json(records: dict, tmp_path: Path) -> None:
    from dglkit.launcher import options

    defaults, program = ids(records, "defaults"), ids(records, "program")
    assert program["job"].startswith("train_dist-synthetic-2w-") and program["partition"] == defaults["partition"]
    config = tmp_path / "job.json"
    config.write_text(json.dumps(program["job_json"]))
    parser = argparse.ArgumentParser()
    options.add_arguments(parser)
    cfg = options.settings(parser.parse_args(["--config", str(config)]))
    assert cfg.command == "python3 train_dist.py --graph_name {graph_name} --ip_config {ip_config}"
    assert cfg.program_dir == "/srv/dglkit/programs/train_dist-0123456789ab" and cfg.train_args == [] and cfg.train == {}
    assert cfg.python_env == "/srv/dglkit/program-envs/train_dist-ba9876543210"


def test_node_data_names_make_another_job_and_reach_the_launcher(records: dict, tmp_path: Path) -> None:
    from dglkit.launcher import options

    program, named = ids(records, "program"), ids(records, "program-names")
    assert named["job"] != program["job"] and named["partition"] == program["partition"]
    assert "node_data_names" not in program["settings"]  # ids of jobs without the setting stay what they were
    config = tmp_path / "job.json"
    config.write_text(json.dumps(named["job_json"]))
    parser = argparse.ArgumentParser()
    options.add_arguments(parser)
    cfg = options.settings(parser.parse_args(["--config", str(config)]))
    assert cfg.node_data_names == {"feat": "features", "paper": {"labels": "label"}}


def test_job_json_of_a_resized_cluster_uses_the_new_partition(records: dict) -> None:
    resized = ids(records, "resized")
    assert resized["job_json"]["part_config"] == f"/srv/dglkit/partitions/{resized['partition']}/synthetic.json"
    assert resized["job_json"]["job_dir"] == resized["dir"]


@pytest.mark.parametrize("case, message", [
    ("epochs-word", "argument 'dgl_job_epochs' is of type"),
    ("graphbolt-word", "'maybe' is not a valid boolean"),
    ("fan-out-word", "option 'dgl_job_fan_out'"),
    ("dataset", "dgl_job_dataset=products: use synthetic, synthetic-hetero, files, chunked or an ogbn-* name"),
    ("builder", "dgl_job_partition_builder must be one of: lean, dgl, distributed, mpi, got: metis"),
    ("task", "value of dgl_job_task must be one of: node_classification, link_prediction, got: regression"),
    ("hetero-links", "dgl_job_task=link_prediction runs on homogeneous graphs; synthetic-hetero is heterogeneous"),
    ("weight-decay", "dgl_job_weight_decay=-0.1: use a value >= 0"),
    ("fan-out-layers", "dgl_job_fan_out=5,10,15: needs 2 values, one per layer"),
    ("dropout", "dgl_job_dropout=1.5: use a value >= 0 and < 1"),
    ("trainers", "dgl_job_trainers=0: use a value >= 1"),
    ("files-path", "dgl_job_dataset=files needs dgl_job_files_path"),
    ("chunked-path", "dgl_job_dataset=chunked needs dgl_job_chunked_path"),
    ("job-id", "dgl_job_id=../elsewhere: use letters, digits, ., _ and - only, starting with a letter or digit"),
    ("job-id-dots", "dgl_job_id=..: '.' and '..' are not names (it names a directory)"),
    ("program-name-dot", "dgl_program_name=.: '.' and '..' are not names (it names a directory)"),
    ("memory-max", "dgl_job_memory_max=8GB: use bytes with K, M, G or T (e.g. 48G), a percentage"),
    ("cpu-quota", "dgl_job_cpu_quota=2: use a percentage of one core (400% = four cores)"),
    ("program-dir", "dgl_program_dir=/nonexistent/project: no such directory on the controller"),
    ("program-placeholder", "dgl_program_command names unknown placeholder(s) {graf_name}; known: {ip_config}"),
    ("program-command", "dgl_program_command is empty"),
    ("program-one-word", "dgl_program_command=python3 is one word: with -e, quote the whole command"),
    ("names-without-program", "dgl_job_node_data_names names node data for your own program: set dgl_program_dir"),
    ("names-list", "dgl_job_node_data_names={\"feat\": [\"features\"]}: map a node data name to the name"),
    ("program-links", "project: symbolic link(s) data, secret lead out of the program's directory; the kit ships"),
])
def test_bad_settings_fail_with_a_message_that_names_them(records: dict, case: str, message: str) -> None:
    assert message in records[f"reject-{case}"]


def test_a_program_without_requirements_ships_and_runs_with_the_node_venv(tmp_path: Path) -> None:
    # requirements.txt is optional: a directory with one launch.py-style script is a whole program.
    program, workspace = tmp_path / "launchpy", tmp_path / "ws"
    program.mkdir()
    workspace.mkdir()
    shutil.copy(REPO / "tests/programs/train_dist/train_dist.py", program / "train.py")
    inventory = tmp_path / "hosts.yml"
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory.write_text(yaml.safe_dump({"all": {"children": {"cluster": {"vars": local, "children": {
        "storage": {"hosts": {"node1": {}}}, "workers": {"hosts": {"node2": {}}}}}}}}))
    env = {**os.environ, "ANSIBLE_STDOUT_CALLBACK": "json", "ANSIBLE_NOCOLOR": "1"}
    reports = []
    for _ in range(2):
        proc = subprocess.run([BIN / "ansible-playbook", "-i", inventory, "tests/kit/program_role.yml",
                               "-e", f"program={program}", "-e", f"workspace={workspace}"],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        reports.append(json.loads(proc.stdout))
    [record] = [result["msg"]["value"] for play in reports[0]["plays"] for task in play["tasks"]
                for result in task["hosts"].values() if isinstance(result.get("msg"), dict)]
    assert record["python_env"] == f"{workspace}/venv"
    assert record["id"].startswith("launchpy-") and record["dir"] == f"{workspace}/programs/{record['id']}"
    assert sorted(p.name for p in Path(record["dir"]).iterdir()) == [".fingerprint", "train.py"]
    assert not (workspace / "program-envs").exists()
    assert [counts["changed"] for counts in reports[1]["stats"].values()] == [0, 0]
