"""playbooks/train.yml running the user's own program instead of the kit's trainer, on the training cluster
(node1 storage, node2 and node3 workers; conftest.train_cluster): tests/programs/train_dist, written for DGL's
tools/launch.py, with an extra requirement that only the wheelhouse has; tests/programs/feature_sum, with none.
The same program again is not copied again; a changed one runs
as a new version; a program silent for longer than the stall timeout completes; a crashing one stops every
node; bad input fails before anything starts. The programs read DGL's example names (`features`), given by
dgl_job_node_data_names; an unsupervised GraphSAGE alone in its directory and an RGCN write outputs to
relative paths, which come back in the run folder.

The tests share the cluster and a copy of the program, and run in file order.
"""
from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

# site and runs: the training cluster that test_builtin_tasks and test_train share (conftest.train_cluster).
from jobhelpers import assert_clean, flat, run_folder, train
from test_train import runs, site  # noqa: F401 (the training cluster's fixtures)

if TYPE_CHECKING:
    from conftest import Cluster

PROGRAMS = Path(__file__).resolve().parents[1] / "programs"
PROGRAM = PROGRAMS / "train_dist"
COMMAND = ("python3 train_dist.py --graph_name {graph_name} --ip_config {ip_config} --part_config {part_config} "
           "--output_dir {output_dir} --num_epochs 3")
DATASET = ["-e", "dgl_job_synthetic_nodes=20000"]


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The user's project directory on the controller (a copy: a test changes it)."""
    return Path(shutil.copytree(PROGRAM, tmp_path_factory.mktemp("project") / "train_dist"))


def run_program(cluster: Cluster, runs: Path, program: Path, command: str = COMMAND, *args: str, check: bool = True,
                names: dict | None = None, dataset: tuple[str, ...] = tuple(DATASET)):
    # JSON: -e key=value would split the command at its spaces. The programs read DGL's `features`.
    program_vars = json.dumps({"dgl_program_dir": str(program), "dgl_program_command": command,
                               "dgl_job_node_data_names": {"feat": "features"} if names is None else names})
    return train(cluster, runs, *dataset, "-e", program_vars, *args, check=check)


def assert_no_program_left(cluster: Cluster) -> None:
    """assert_clean looks for the kit's processes; the programs' are named after their scripts."""
    assert_clean(cluster)
    for host in cluster.groups()["workers"]:
        left = cluster.ssh(host, "pgrep -af '[t]rain_dist|[n]ode_classification[.]py'", check=False).stdout
        assert left == "", (host, left)


def job_of(folder: Path) -> dict:
    return json.loads((folder / "job.json").read_text())


def test_a_launchpy_program_trains_with_a_requirement_from_the_wheelhouse(site: Cluster, runs: Path, program: Path):
    run = run_program(site, runs, program)
    folder = run_folder(run.output)
    assert folder.name.startswith("train_dist-synthetic-2w-"), folder
    assert "succeeded" in flat(run.output) and "[node2 succeeded, node3 succeeded]" in flat(run.output)
    result = json.loads((folder / "result.json").read_text())
    assert result["val_acc"] > 0.5, result  # chance: 0.1
    epochs = [m for m in map(json.loads, (folder / "metrics.jsonl").read_text().splitlines()) if m["event"] == "epoch"]
    assert [m["epoch"] for m in epochs] == [0, 1, 2]
    assert (folder / "curves.png").stat().st_size > 0 and "epochs          3 of 3" in (folder / "summary.txt").read_text()
    # The program's own table (tabulate) in each worker's trainer log.
    for node, rank in (("node2", 0), ("node3", 1)):
        assert "epoch    loss    val_acc" in (folder / "nodes" / node / f"trainer-{rank}.log").read_text(), node
    job = job_of(folder)
    assert job["command"] == COMMAND and job["train_args"] == []
    assert Path(job["program_dir"]).parent == Path("/srv/dglkit/programs")
    env = Path(job["python_env"])
    assert env.parent == Path("/srv/dglkit/program-envs")
    # tabulate came from the wheelhouse into the program's environment; the node venv stays without it.
    installed = (site.workspace / "program-envs" / env.name / ".installed").read_text()
    assert "/opt/dglkit-offline/wheelhouse/tabulate-" in installed, installed
    assert site.ssh("node2", "/srv/dglkit/venv/bin/python -c 'import tabulate'", check=False).returncode != 0
    versions = site.ssh("node2", f"DGLBACKEND=pytorch {env}/bin/python -c 'import tabulate, dgl, torch; "
                        "print(torch.__version__, dgl.__version__)'").stdout.split()
    assert versions[-2:] == ["2.2.1+cu121", "2.1.0"], versions  # the node venv's pins, untouched
    assert_no_program_left(site)


def test_a_program_without_requirements_runs_with_the_node_venv_and_its_large_output_is_fetched(
        site: Cluster, runs: Path):
    # requirements.txt is optional: one launch.py-style script is a whole program.
    bare = PROGRAM.parent / "feature_sum"
    assert [p.name for p in bare.iterdir() if p.name != "__pycache__"] == ["feature_sum.py"]
    # It reads the kit's own name, `feat`, as DGL's tutorial does: no node data names. Over 32 MB the results
    # archive is a file that train.yml fetches and removes, not command output.
    run = run_program(site, runs, bare, "python3 feature_sum.py --graph_name {graph_name} --ip_config {ip_config} "
                      "--part_config {part_config} --output_dir {output_dir} --extra_mb 40", names={})
    folder = run_folder(run.output)
    assert folder.name.startswith("feature_sum-synthetic-2w-") and "[node2 succeeded, node3 succeeded]" in flat(run.output)
    assert json.loads((folder / "result.json").read_text())["num_nodes"] == 20000
    assert job_of(folder)["python_env"] == "/srv/dglkit/venv"
    assert (folder / "extra.bin").stat().st_size == 40 << 20
    assert not list(runs.glob(".*.tar")), list(runs.glob(".*.tar"))
    assert site.ssh("node1", "ls /tmp | grep -c dglkit-pack || true").stdout.strip() == "0"
    assert_no_program_left(site)


def test_the_same_program_silent_longer_than_the_stall_timeout_is_not_copied_again(
        site: Cluster, runs: Path, program: Path):
    versions = sorted(p.name for p in (site.workspace / "programs").iterdir())
    shipped = [(site.workspace / "programs" / name / ".fingerprint").stat().st_mtime for name in versions]
    envs = sorted((site.workspace / "program-envs").glob("*/.installed"))
    built = [env.stat().st_mtime for env in envs]
    started = time.time()
    run = run_program(site, runs, program, COMMAND + " --quiet_seconds 25", "-e", "dgl_job_stall_timeout=10")
    assert time.time() - started > 25
    folder = run_folder(run.output)
    assert json.loads((folder / "result.json").read_text())["num_epochs"] == 3
    assert sorted(p.name for p in (site.workspace / "programs").iterdir()) == versions
    assert [(site.workspace / "programs" / name / ".fingerprint").stat().st_mtime for name in versions] == shipped
    assert sorted((site.workspace / "program-envs").glob("*/.installed")) == envs
    assert [env.stat().st_mtime for env in envs] == built


def test_a_changed_program_runs_as_a_new_version(site: Cluster, runs: Path, program: Path):
    before = {p.name for p in (site.workspace / "programs").iterdir()}
    script = program / "train_dist.py"
    script.write_text(script.read_text() + "# changed by the test\n")
    run = run_program(site, runs, program)
    folder = run_folder(run.output)
    new = {p.name for p in (site.workspace / "programs").iterdir()} - before
    assert len(new) == 1 and before <= {p.name for p in (site.workspace / "programs").iterdir()}
    assert Path(job_of(folder)["program_dir"]).name == new.pop()
    assert (site.workspace / "programs" / Path(job_of(folder)["program_dir"]).name / "train_dist.py").read_text() \
        .endswith("# changed by the test\n")
    assert len(list((site.workspace / "program-envs").glob("*/.installed"))) == 1  # same requirements: same env


def test_a_crashing_program_stops_every_node_with_its_traceback(site: Cluster, runs: Path, program: Path):
    run = run_program(site, runs, program, COMMAND + " --crash_rank 1 --crash_epoch 1", "-e",
                      "dgl_job_poll_seconds=5", "-e", "dgl_job_max_restarts=0", check=False)
    output = flat(run.output)
    assert run.returncode != 0
    # Rank 1 (node3, the second node) raises. Rank 0 (node2) then either fails in its all-reduce, and is named as
    # stopped because of it, or node2's launcher sees node3's FAILED first and stops it (on a loaded machine):
    # either way the report names the trainer that raised, with its own traceback, and never node2's as a cause.
    found = re.search(r"job (\S+) failed on node3: trainer-1: RuntimeError: injected crash on rank 1 in epoch 1 "
                      r"\(at \S+/train_dist\.py:\d+ in main\)(; stopped because of it: node2 trainer-0 \(|; the job)",
                      output)
    assert found, run.output[-4000:]
    assert re.search(r"end of the traceback of trainer-1: Traceback .* raise RuntimeError\(f\"injected crash", output), \
        run.output[-4000:]
    assert "the job wrote no checkpoint.pt, so a new run starts over" in output and "dgl_job_resume" not in output
    job_dir = site.workspace / "jobs" / found.group(1)
    assert "RuntimeError: injected crash on rank 1 in epoch 1" in (job_dir / "nodes/node3/trainer-1.log").read_text()
    failed = json.loads((job_dir / "FAILED").read_text())
    other = {"node2": "node3", "node3": "node2"}[failed["node"]]
    stopped = json.loads((job_dir / "nodes" / other / "status.json").read_text())
    assert stopped["state"] == "failed" and stopped["updated"] - failed["time"] < 15, stopped
    # A failed job has its summary too, shown before the failure and in the run folder.
    summary = (runs / found.group(1) / "summary.txt").read_text()
    assert "outcome         failed on node3: trainer-1: RuntimeError: injected crash on rank 1" in summary, summary
    assert "outcome failed on node3: trainer-1" in output
    assert_no_program_left(site)


@pytest.mark.parametrize("change, error", [
    ({"dir": "/nonexistent/project"}, "dgl_program_dir=/nonexistent/project: no such directory on the controller"),
    ({"command": "python3 train_dist.py --graph_name {graf_name}"},
     "dgl_program_command names unknown placeholder(s) {graf_name}"),
    ({"command": "python3 trian_dist.py --graph_name {graph_name}"}, "node2: python3 would run trian_dist.py, which is not in"),
    ({"requirements": "tabulate==0.10.0\nno-such-package-dglkit==1.0\n"},
     "No matching distribution found for no-such-package-dglkit==1.0"),
    # The YAML callback doubles the quotes around 'feats'.
    ({"names": {"feats": "features"}}, "node2: node data names: the partition has no node data "),
])
def test_bad_program_input_fails_before_anything_starts(site: Cluster, runs: Path, program: Path,
                                                        tmp_path: Path, change: dict, error: str):
    directory = change.get("dir", program)
    if "requirements" in change:
        directory = Path(shutil.copytree(program, tmp_path / "train_dist"))
        (directory / "requirements.txt").write_text(change["requirements"])
    jobs_before = set((site.workspace / "jobs").iterdir())
    run = run_program(site, runs, directory, change.get("command", COMMAND), check=False, names=change.get("names"))
    assert run.returncode != 0 and error in flat(run.output), run.output[-4000:]
    started = [job for job in set((site.workspace / "jobs").iterdir()) - jobs_before
               if list(job.glob("nodes/*/launcher.log"))]
    assert started == []
    assert_no_program_left(site)


def test_an_unsupervised_program_alone_in_its_directory_writes_emb_pt_to_the_run_folder(
        site: Cluster, runs: Path, tmp_path: Path):
    # Nothing but the one .py file: scikit-learn and numpy come with the node environment.
    program = Path(shutil.copytree(PROGRAMS / "train_dist_unsupervised", tmp_path / "unsupervised"))
    assert [p.name for p in program.iterdir()] == ["train_dist_unsupervised.py"]
    command = ("python3 train_dist_unsupervised.py --graph_name {graph_name} --ip_config {ip_config} "
               "--part_config {part_config} --num_epochs 2 --batch_size 500")
    run = run_program(site, runs, program, command)
    folder = run_folder(run.output)
    assert "[node2 succeeded, node3 succeeded]" in flat(run.output)
    # emb.pt: rank 0 saved it to a relative path; the program runs from the job dir, which came back.
    import torch

    assert torch.load(folder / "emb.pt").shape == (20000, 32)
    found = re.search(r"eval acc ([0-9.]+); test acc ([0-9.]+)", (folder / "nodes/node2/trainer-0.log").read_text())
    assert found and float(found.group(1)) > 0.3, found  # scikit-learn on the embeddings; chance: 0.1
    assert job_of(folder)["node_data_names"] == {"feat": "features"}
    assert_no_program_left(site)


def test_an_rgcn_program_reads_per_type_names_and_its_relative_outputs_come_back(site: Cluster, runs: Path):
    command = ("python3 node_classification.py --graph_name {graph_name} --ip_config {ip_config} "
               "--part_config {part_config} --num_epochs 4")
    # The dataset of test_builtin_tasks' RGCN job: the same partition when both run.
    run = run_program(site, runs, PROGRAMS / "rgcn", command, names={"paper": {"feat": "features"}},
                      dataset=("-e", "dgl_job_dataset=synthetic-hetero", "-e", "dgl_job_synthetic_nodes=6000",
                               "-e", "dgl_job_synthetic_classes=5"))
    folder = run_folder(run.output)
    assert folder.name.startswith("rgcn-synthetic-hetero-2w-"), folder
    result = json.loads((folder / "result.json").read_text())
    assert result["val_acc"] > 0.3 and result["num_classes"] == 5, result  # chance: 0.2
    assert (folder / "model.pt").stat().st_size > 0
    for node, rank in (("node2", 0), ("node3", 1)):
        assert "Test Acc" in (folder / "nodes" / node / f"trainer-{rank}.log").read_text(), node
    assert_no_program_left(site)
