"""`dglkit launch` running a program written for DGL's launch.py (tests/programs/train_dist): placeholders,
the trainers' torchrun environment, pre-flight refusals, and real local runs (trains and reports; silent for
longer than the stall timeout; a crashing trainer)."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from dglkit import nodedata
from dglkit.common import UserError
from dglkit.launcher import command as launch_command
from dglkit.launcher import preflight, start
from localjob import assert_job_gone, build, free_ports, local_ports, start_launch

REPO = Path(__file__).resolve().parents[2]
PROGRAM = REPO / "tests" / "programs" / "train_dist"
WHEELHOUSE = Path("/var/cache/dglkit/wheelhouse")
COMMAND = ("python3 train_dist.py --graph_name {graph_name} --ip_config {ip_config} --part_config {part_config} "
           "--output_dir {output_dir} --num_epochs 3 --batch_size 200")
# train_dist reads `features`, as DGL's examples do; the kit's partitions store `feat`.
NAMES = json.dumps({"feat": "features"})


def test_the_role_knows_the_launchers_placeholders():
    role_vars = yaml.safe_load((REPO / "roles/dgl_program/vars/main.yml").read_text())
    assert role_vars["__dgl_program_placeholders"] == list(launch_command.PLACEHOLDERS)


def test_placeholders_are_replaced_by_quoted_values_and_shell_variables_kept():
    expanded = launch_command.expand("python3 t.py --g {graph_name} --n {num_machines} ${HOME} {a,b}",
                             {"graph_name": "my graph", "num_machines": 2})
    assert expanded == "python3 t.py --g 'my graph' --n 2 ${HOME} {a,b}"
    with pytest.raises(UserError, match=r"unknown placeholder\(s\) \{graf\}.*known: \{ip_config\}"):
        launch_command.expand("python3 t.py {graf}", {"graph_name": "g"})


def test_a_trainer_gets_the_ranks_and_rendezvous_that_torchrun_would_give_it():
    # Trainer 1 of machine 2 (3 machines, 2 trainers each), as `torchrun --nnodes=3 --node_rank=2
    # --nproc_per_node=2 --master_addr=10.0.0.1 --master_port=29500` sets it for its second process.
    env = start.trainer_environment(5, 1, 2, 3, 2, "10.0.0.1", 29500)
    assert {key: env[key] for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                      "MASTER_ADDR", "MASTER_PORT")} == {
        "RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "6", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "2",
        "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}


def check(cli, partition_1, tmp_path, command: str):
    return cli("launch", "--local", "--part-config", partition_1, "--job-dir", tmp_path / "job", "--program-dir",
               PROGRAM, "--server-port", free_ports(2), "--master-port", free_ports(1), "--command", command, "--check")


def test_check_expands_the_command_and_starts_nothing(cli, partition_1, tmp_path):
    code, result, err = check(cli, partition_1, tmp_path, COMMAND)
    assert code == 0, err
    # It runs from the job dir (relative writes land there), its script named in the program dir.
    assert result["command"].startswith(f"python3 {PROGRAM}/train_dist.py --graph_name graph --ip_config "
                                        f"{tmp_path}/job/ip_config.txt --part_config {partition_1} --output_dir "
                                        f"{tmp_path}/job --num_epochs 3")
    assert result["cwd"] == str(tmp_path / "job") and not (tmp_path / "job").exists()


def test_the_pre_flight_checks_job_json_ahead_but_leaves_the_earlier_run_and_the_ports_to_train_yml(partition_1, tmp_path):
    job_dir = tmp_path / "job"
    config = {"local": True, "part_config": str(partition_1), "job_dir": str(job_dir), "program_dir": str(PROGRAM),
              "server_port": free_ports(2), "master_port": free_ports(1), "command": COMMAND}
    assert preflight.check_ahead(config, "n1", False) == {"checked": True, "error": None}
    # The placeholders, the command's programs and script: as `launch --check` says.
    bad_placeholder = preflight.check_ahead({**config, "command": COMMAND + " {graf}"}, "n1", False)
    assert "unknown placeholder(s) {graf}" in bad_placeholder["error"]
    assert "train.py, which is not in" in preflight.check_ahead({**config, "command": "python3 train.py"}, "n1", False)["error"]
    # An earlier run that failed or was stopped: train.yml moves its FAILED and STOP to history/ before the start.
    job_dir.mkdir()
    (job_dir / "FAILED").write_text(json.dumps({"node": "n1", "attempt": 1}))
    (job_dir / "STOP").touch()
    with socket.socket() as holder:  # the server port in use: `control ready` judges the ports (an attach is no fault)
        holder.bind(("127.0.0.1", config["server_port"]))
        holder.listen()
        assert preflight.check_ahead(config, "n1", False) == {"checked": True, "error": None}
    # A partition still to be made: train.yml runs `launch --check` once it is there.
    unmade = {**config, "part_config": str(tmp_path / "none.json")}
    assert preflight.check_ahead(unmade, "n1", False) == {"checked": False, "error": None}


@pytest.mark.parametrize("command, expected", [
    ("python3 -u train_dist.py --x 1", f"python3 -u {PROGRAM}/train_dist.py --x 1"),
    ("python3 -m train_dist --x 1", "python3 -m train_dist --x 1"),  # the program dir is on PYTHONPATH
    ("./requirements.txt python3 train_dist.py", f"{PROGRAM}/requirements.txt python3 {PROGRAM}/train_dist.py"),
    ("python3 /elsewhere/train.py", "python3 /elsewhere/train.py"),
])
def test_the_script_and_relative_programs_are_named_in_the_program_dir(command, expected):
    assert launch_command.in_program_dir(command, PROGRAM) == expected


@pytest.mark.parametrize("command, error", [
    ("python3 train_dist.py --graph_name {graf_name}", "unknown placeholder(s) {graf_name}"),
    ("python3 trian_dist.py --graph_name {graph_name}", "would run trian_dist.py, which is not in"),
    ("python3.99 train_dist.py", "`python3.99` of the command is not an executable"),
    ("no-such-tool --wrap python3 train_dist.py", "`no-such-tool` of the command is not an executable"),
    ("./train.sh {graph_name}", "starts no python"),
    ("python3", "gives python no script"),
    ("python3 train_dist.py --name 'unclosed", "not a valid shell command line"),
])
def test_bad_commands_are_refused_before_anything_starts(cli, partition_1, tmp_path, command, error):
    code, _, err = check(cli, partition_1, tmp_path, command)
    assert code == 2 and error in err, err
    assert not (tmp_path / "job").exists()


@pytest.fixture(scope="session")
def program_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The program's requirements (not in the app's environment), from the test wheelhouse, for PYTHONPATH."""
    target = tmp_path_factory.mktemp("program-site")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--find-links", WHEELHOUSE,
                    "--target", target, "-r", PROGRAM / "requirements.txt"], check=True)
    return target


@pytest.fixture(scope="module")
def hetero_partition_1(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("hetero")
    build("prepare", "--dataset", "synthetic-hetero", "--out", out / "data", "--num-nodes", "2000", "--seed", "3")
    build("partition", "--dataset-dir", out / "data", "--out", out / "parts", "--num-parts", 1, "--graph-name", "het")
    return out / "parts" / "het.json"


def start_program(job_dir: Path, part_config: Path, site: Path, *args: object, command: str = COMMAND):
    ports_options, ports = local_ports(2)
    proc = start_launch(job_dir, "--local", "--part-config", part_config, "--node-name", "n1", *ports_options,
                        "--num-trainers", 2, "--program-dir", PROGRAM, "--node-data-names", NAMES, *args,
                        "--command", command, pythonpath=(site,))
    return proc, ports


def wait_for_text(launch_proc, path: Path, text: str, timeout: float = 200) -> None:
    deadline = time.time() + timeout
    while not (path.exists() and text in path.read_text()):
        assert launch_proc.poll() is None, f"the launcher exited {launch_proc.returncode} before {path} had {text!r}"
        assert time.time() < deadline, f"{path} has no {text!r} after {timeout:.0f} s"
        time.sleep(0.3)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_program_silent_longer_than_the_stall_timeout_trains_with_launchpys_environment(
        partition_1, program_site, tmp_path, dglkit):
    job_dir = tmp_path / "job"
    shm_before = set(os.listdir("/dev/shm"))
    launch_proc, ports = start_program(job_dir, partition_1, program_site, "--stall-timeout", 10,
                                       command=COMMAND + " --quiet_seconds 15")
    status_file = job_dir / "nodes/n1/status.json"
    wait_for_text(launch_proc, job_dir / "metrics.jsonl", '"epoch"')
    # Epoch 0 is done and the program is quiet for 15 s: look at the environment DGL's launch.py would give.
    pids = {p["name"]: p["pid"] for p in json.loads(status_file.read_text())["processes"]}
    server = psutil.Process(pids["server-1"]).environ()
    assert {k: server[k] for k in ("DGL_ROLE", "DGL_SERVER_ID", "DGL_NUM_SERVER", "DGL_NUM_CLIENT", "DGL_NUM_SAMPLER",
                                   "DGL_GRAPH_FORMAT", "DGL_KEEP_ALIVE", "OMP_NUM_THREADS", "DGLKIT_OUTPUT_DIR")} == {
        "DGL_ROLE": "server", "DGL_SERVER_ID": "1", "DGL_NUM_SERVER": "2", "DGL_NUM_CLIENT": "2",
        "DGL_NUM_SAMPLER": "0", "DGL_GRAPH_FORMAT": "csc", "DGL_KEEP_ALIVE": "0", "OMP_NUM_THREADS": "1",
        "DGLKIT_OUTPUT_DIR": str(job_dir)}
    # The program reads `features`: its servers serve the partition's `feat` under that name.
    assert json.loads(server["DGLKIT_NODE_DATA_NAMES"]) == {"_N/feat": "_N/features"}
    # Each trainer is the launcher's own child, with torchrun's environment: init_process_group() meets on it.
    trainers = [psutil.Process(pids[f"trainer-{rank}"]) for rank in (0, 1)]
    assert [(p.environ()["RANK"], p.environ()["LOCAL_RANK"], p.environ()["WORLD_SIZE"]) for p in trainers] == [
        ("0", "0", "2"), ("1", "1", "2")]
    trainer = trainers[0].environ()
    assert {k: trainer[k] for k in ("DGL_DIST_MODE", "DGL_ROLE", "DGL_GROUP_ID", "DGL_CONF_PATH", "DGL_IP_CONFIG")} == {
        "DGL_DIST_MODE": "distributed", "DGL_ROLE": "client", "DGL_GROUP_ID": "0",
        "DGL_CONF_PATH": str(partition_1), "DGL_IP_CONFIG": str(job_dir / "ip_config.txt")}
    assert all(Path(p.cwd()) == job_dir for p in trainers)
    assert PROGRAM.samefile(trainers[0].environ()["PYTHONPATH"].split(os.pathsep)[1])

    # The launcher's last lines come before its status says it succeeded: whoever packs the job on seeing that
    # (dglkit watch --pack) gets them all.
    deadline = time.time() + 240
    while launch_proc.poll() is None and time.time() < deadline:
        if (json.loads(status_file.read_text()) or {}).get("state") == "succeeded":
            assert (job_dir / "nodes/n1/launcher.log").read_text().rstrip().endswith("succeeded")
            break
        time.sleep(0.005)
    assert launch_proc.wait(timeout=240) == 0, (job_dir / "launch.out").read_text()[-3000:]
    epochs = [m for m in map(json.loads, (job_dir / "metrics.jsonl").read_text().splitlines()) if m["event"] == "epoch"]
    assert [m["epoch"] for m in epochs] == [0, 1, 2] and epochs[-1]["val_acc"] > 0.6, epochs  # chance 0.2
    # tabulate (the program's own requirement) printed the final table.
    assert "epoch    loss    val_acc" in (job_dir / "nodes/n1/trainer-0.log").read_text()
    assert json.loads(dglkit("report", "--job-dir", job_dir).stdout.splitlines()[-1])["epochs"] == 3
    assert (job_dir / "curves.png").stat().st_size > 0
    assert_job_gone(job_dir, ports, shm_before)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_crashing_program_fails_the_job_with_its_traceback(partition_1, program_site, tmp_path):
    job_dir = tmp_path / "job"
    shm_before = set(os.listdir("/dev/shm"))
    launch_proc, ports = start_program(job_dir, partition_1, program_site, "--grace", 5,
                                       command=COMMAND + " --crash_rank 1 --crash_epoch 1")
    wait_for_text(launch_proc, job_dir / "nodes/n1/trainer-0.log", "Epoch 00000")
    # Epoch 1 raises a step or two later: the job fails within seconds, not in DGL's exit.
    assert launch_proc.wait(timeout=60) == 1, (job_dir / "launch.out").read_text()[-3000:]
    failed = json.loads((job_dir / "FAILED").read_text())
    # The program's rank 1 is DGL's (g.rank(), the servers' numbering), not necessarily torch's RANK, which names
    # the kit's trainers.
    assert failed["process"] in ("trainer-0", "trainer-1") and failed["log"].endswith(f"{failed['process']}.log"), failed
    assert "RuntimeError: injected crash on rank 1 in epoch 1" in failed["log_tail"], failed["log_tail"]
    assert_job_gone(job_dir, ports, shm_before)


def test_node_data_names_are_read_from_the_partition_as_dgl_stores_them(partition_1, hetero_partition_1):
    from dgl.data.utils import load_tensors

    for config in (partition_1, hetero_partition_1):
        part = config.parent / json.loads(config.read_text())["part-0"]["node_feats"]
        assert sorted(nodedata.tensor_names(part)) == sorted(load_tensors(str(part)))
    stored = {ntype: sorted(names) for ntype, names in nodedata.partition_node_data(hetero_partition_1).items()}
    assert stored == {"author": [], "field_of_study": [], "institution": [],
                      "paper": ["feat", "labels", "test_mask", "train_mask", "val_mask"]}


@pytest.mark.parametrize("names, served", [
    ({"feat": "features"}, {"paper/feat": "paper/features"}),
    ({"paper": {"feat": "features", "labels": "label"}}, {"paper/feat": "paper/features", "paper/labels": "paper/label"}),
    ({"feat": "features", "paper": {"feat": "x"}}, {"paper/feat": "paper/x"}),  # the type's own wins
])
def test_node_data_names_per_type_or_for_every_type(hetero_partition_1, names, served):
    assert nodedata.served_names(hetero_partition_1, names) == served


@pytest.mark.parametrize("names, error", [
    ({"feats": "features"}, "the partition has no node data 'feats'; it has _N: labels"),
    ({"_N": {"features": "x"}}, "no node data 'features' on node type '_N'"),
    ({"paper": {"feat": "features"}}, "the partition has no node type 'paper'; it has _N:"),
    ({"feat": "labels"}, "node type '_N' would serve _N/labels twice"),
    ({"feat": "a/b"}, "'feat' -> \"a/b\": the name a program reads is a non-empty string without '/'"),
])
def test_a_wrong_node_data_name_is_refused_before_anything_starts(cli, partition_1, tmp_path, names, error):
    code, _, err = cli("launch", "--local", "--part-config", partition_1, "--job-dir", tmp_path / "job",
                       "--program-dir", PROGRAM, "--server-port", free_ports(2), "--master-port", free_ports(1),
                       "--node-data-names", json.dumps(names), "--command", COMMAND, "--check")
    assert code == 2 and error in err, err
    assert not (tmp_path / "job").exists()


NEWER_API = """\
import argparse

import dgl
import torch as th

parser = argparse.ArgumentParser()
parser.add_argument("--graph_name")
parser.add_argument("--ip_config")
parser.add_argument("--part_config")
args = parser.parse_args()
dgl.distributed.initialize(args.ip_config)
th.distributed.init_process_group(backend="gloo")
g = dgl.distributed.DistGraph(args.graph_name, part_config=args.part_config)
sampler = dgl.dataloading.NeighborSampler([5])
# DGL's examples on master (DGL >= 2.2); DGL 2.1 has it as dgl.dataloading.DistNodeDataLoader.
loader = dgl.distributed.DistNodeDataLoader(g, th.arange(10), sampler, batch_size=5)
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_program_that_needs_a_newer_dgl_fails_saying_which_dgl_runs_and_how_to_get_another(partition_1, tmp_path):
    program = tmp_path / "program"
    program.mkdir()
    (program / "node_classification.py").write_text(NEWER_API)
    job_dir = tmp_path / "job"
    ports_options, _ = local_ports(1)
    launch_proc = start_launch(job_dir, "--local", "--part-config", partition_1, "--node-name", "n1", *ports_options,
                               "--program-dir", program, "--command",
                               "python3 node_classification.py --graph_name {graph_name} --ip_config {ip_config} "
                               "--part_config {part_config}")
    assert launch_proc.wait(timeout=240) == 1, (job_dir / "launch.out").read_text()[-3000:]
    failed = json.loads((job_dir / "FAILED").read_text())
    assert failed["process"] == "trainer-0", failed
    # The process's own error (its failure record), then what the kit knows about it.
    assert failed["reason"].startswith("AttributeError: module 'dgl.distributed' has no attribute 'DistNodeDataLoader'; "
                                       "the program needs dgl.distributed.DistNodeDataLoader, which the cluster's DGL "
                                       "2.1.0 does not have"), failed["reason"]
    assert "set dglkit_dgl_spec: dgl-repo for a newer DGL from DGL's wheel repo" in failed["reason"]
