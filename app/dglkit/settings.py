"""Every job setting, declared once: its type, default, help, whether it changes the job id and who reads it.

Standard library only: the controller runs this (`dglkit plan`, `dglkit settings`) with Ansible's Python.
The role's defaults and argument specs, the sample inventory's job.yml and the table in docs/settings.md
are generated from SETTINGS (`python -m dglkit settings --write`); a kit test fails when they drift.
"""

import argparse
import json
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PREFIX = "dgl_job_"

# Who reads a setting: the trainers (the job's settings file), the launcher (job.json), the dgl_dataset role
# (playbooks/vars/dgl_dataset.yml) or the dgl_job role's tasks themselves.
TRAINER, LAUNCHER, DATASET, PLAYBOOK = "trainer", "launcher", "dataset", "playbook"
# What a setting changes: the job id through the hash of the training settings, or through the partition
# (dataset settings make another dataset or partition id, hence another job id). A new JOB setting changes
# every job id (tests/unit/test_plan.py's recorded ids say so): see plan.job_settings for the way around it.
JOB, PARTITION = "job", "partition"


@dataclass(frozen=True)
class Setting:
    name: str  # without the dgl_job_ prefix
    type: str  # int, float, bool, str, path, list (of int), dict
    default: Any
    help: str
    reader: str
    identity: str | None = None  # JOB, PARTITION or None (changes no id)
    choices: tuple[str, ...] = ()
    shown: str | None = None  # the default as documented, when the default is an Ansible expression
    sample: str | None = "value"  # job.yml: "value" (set), "comment" (commented out), None (left out)
    example: Any = None  # job.yml's value of a commented-out setting, when not the default
    elements: str = "int"  # of a list
    flag: str | None = None  # the trainer's option, when not --<name>
    # The checks every reader applies (plan on the controller, the trainer, the launcher): bounds, inclusive
    # (minimum, maximum) or not (above, below), and for a str a pattern with what to write instead.
    minimum: float | None = None
    maximum: float | None = None
    above: float | None = None
    below: float | None = None
    pattern: tuple[str, str] | None = None
    key: str | None = None  # the launcher's job.json key (its long flag), when not the name

    @property
    def var(self) -> str:
        return PREFIX + self.name

    @property
    def option(self) -> str:
        """The trainer's command-line option (`dglkit train`)."""
        return self.flag or "--" + self.name.replace("_", "-")

    @property
    def dest(self) -> str:
        """The trainer's name of it: its option's, and its key in job.json's "train"."""
        return self.option[2:].replace("-", "_")

    @property
    def launch_key(self) -> str:
        """The launcher's name of it: its job.json key and, with dashes, its long flag."""
        return self.key or self.name

    def train_value(self, value: Any) -> Any:
        """As the trainer's option takes it: a list as its comma-separated text."""
        return ",".join(map(str, value)) if isinstance(value, list) else value

    def bounds(self) -> list[tuple[str, float]]:
        """The declared bounds as (comparison, bound) pairs, e.g. [(">=", 0), ("<", 1)]."""
        declared = [(">=", self.minimum), (">", self.above), ("<=", self.maximum), ("<", self.below)]
        return [(sign, bound) for sign, bound in declared if bound is not None]

    def bounds_text(self) -> str:
        return " and ".join(f"{sign} {bound:g}" for sign, bound in self.bounds())

    def problem(self, value: Any) -> str | None:
        """What is wrong with a value of the declared type, as "use ..." advice, or None."""
        if self.pattern is not None:
            return None if re.fullmatch(self.pattern[0], str(value)) else self.pattern[1]
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return None
        number = float(value)
        within = {">=": number.__ge__, ">": number.__gt__, "<=": number.__le__, "<": number.__lt__}
        if all(within[sign](bound) for sign, bound in self.bounds()):
            return None
        return f"use a value {self.bounds_text()}"


def parse_fan_out(value: Any) -> list[int]:
    """fan_out as a list of ints, from the list or its comma-separated text; ValueError when it is neither."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list) or not items:
        raise ValueError(f"not a list: {value!r}")
    return [int(item.strip() if isinstance(item, str) else item) for item in items]


def fan_out_problem(fan_out: list[int], layers: int) -> str | None:
    """The fan_out rule of plan and trainer alike: one value per layer, each >= 1 or -1 (all neighbours)."""
    if len(fan_out) != layers:
        return f"needs {layers} values, one per layer"
    if any(f < 1 and f != -1 for f in fan_out):
        return "use values >= 1, or -1 for all neighbours"
    return None


# The checks that several settings share, or that are too long for their line.
PORT: dict[str, Any] = {"minimum": 1, "maximum": 65535}
MEMORY_MAX = (r"([1-9][0-9]*[KMGT]?|([1-9][0-9]?|100)%|infinity)?",
              "use bytes with K, M, G or T (e.g. 48G), a percentage of the node's memory (80%), or empty")
CPU_QUOTA = (r"([1-9][0-9]*%)?", "use a percentage of one core (400% = four cores), or empty")


@dataclass(frozen=True)
class Section:
    title: str
    comment: str  # job.yml's comment above the section's settings


SECTIONS: list[tuple[Section, list[Setting]]] = [
    (Section("Task", "Task: node_classification (GraphSAGE; RGCN when the dataset is heterogeneous) or "
             "link_prediction\n(GraphSAGE encoder on a homogeneous graph, MRR and hits@k on held-out edges)."), [
        Setting("task", "str", "node_classification",
                "node_classification trains GraphSAGE, or RGCN when the dataset is heterogeneous (synthetic-hetero, "
                "ogbn-mag, files with num_nodes.json); link_prediction trains a GraphSAGE encoder on a homogeneous "
                "graph with held-out edges and reports MRR and hits@k.",
                TRAINER, JOB, choices=("node_classification", "link_prediction")),
    ]),
    (Section("Dataset", "Dataset: synthetic (a community graph of any size, features and labels follow the communities),\n"
             "         synthetic-hetero (papers, authors, institutions, fields of study; labels on papers),\n"
             "         ogbn-products, ogbn-mag or another ogbn-* node-property dataset, or files (your own graph;\n"
             "         a directory with num_nodes.json is heterogeneous, see docs/datasets.md), or chunked (a graph in\n"
             "         DGL's chunked graph format that no host has to hold whole).\n"
             "The dataset settings reach the dgl_dataset role through playbooks/vars/dgl_dataset.yml."), [
        Setting("dataset", "str", "synthetic",
                "synthetic, synthetic-hetero (papers, authors, institutions, fields; labels on papers), files, chunked "
                "(DGL's chunked graph format at dgl_job_chunked_path), or an OGB node-property dataset "
                "(ogbn-products, ogbn-arxiv, ogbn-mag, ...).", DATASET, PARTITION),
        Setting("synthetic_nodes", "int", 100000, "Nodes of the synthetic graph.", DATASET, PARTITION, minimum=2),
        Setting("synthetic_degree", "int", 10, "Mean degree of the synthetic graph.", DATASET, PARTITION, minimum=1),
        Setting("synthetic_classes", "int", 10, "Classes of the synthetic graph.", DATASET, PARTITION, minimum=2),
        Setting("synthetic_feat_dim", "int", 64, "Feature dimension of the synthetic graph.", DATASET, PARTITION, minimum=1),
        Setting("synthetic_seed", "int", 0, "Seed of the synthetic graph and its split.", DATASET, PARTITION, minimum=0),
        Setting("ogb_root", "path", "{{ dgl_job_workspace }}/ogb",
                "ogbn-*: directory on the storage host that holds (or receives) ogb's dataset folders "
                "(e.g. <root>/ogbn_products/ with RELEASE_v1.txt).", DATASET, shown="<workspace>/ogb",
                sample="comment", example="/srv/dglkit/ogb"),
        Setting("ogb_download", "bool", False,
                "ogbn-*: let ogb download a missing dataset (needs internet on the storage host); without it, place "
                "the files under dgl_job_ogb_root first.", DATASET, sample="comment"),
        Setting("files_path", "str", "",
                "files: an .npz or a directory of .npy/.csv files on the storage host (edges, feat, labels, optional "
                "masks). The ids come from the path: after changing the files in place, run with "
                "-e dgl_job_force=true.", DATASET, PARTITION, sample="comment",
                example="/srv/dglkit/mygraph.npz"),
        Setting("chunked_path", "str", "",
                "chunked: the directory of a graph in DGL's chunked graph format (metadata.json and its chunk files, "
                "as DGL's tools/chunk_graph.py or GraphStorm's graph construction write them) on the shared "
                "workspace; the mpi builder reads it where it is, chunk by chunk, the other builders read it whole on the "
                "storage host (docs/datasets.md). The ids come from "
                "the path: after changing the files in place, run with -e dgl_job_force=true.", DATASET, PARTITION,
                sample="comment", example="/srv/dglkit/chunked/papers100M"),
        Setting("partition_builder", "str", "lean",
                "How the dataset is partitioned: on the storage host with lean (METIS in a process of its own, then "
                "one part at a time; a fraction of the memory) or dgl (dgl.distributed.partition_graph); or "
                "distributed (the storage host computes the METIS assignment from the structure alone, every worker "
                "builds its own part, so that no host holds the whole graph with its features; lean's output); or "
                "mpi (PT-Scotch and the part build across the workers at once under mpirun, each holding its share: "
                "needs dglkit_mpi and dglkit_ssh_mesh). Each gets its own partition, and refuses before writing "
                "anything when its memory estimate exceeds what a host has.", DATASET, PARTITION,
                choices=("lean", "dgl", "distributed", "mpi")),
    ]),
    (Section("Model and training", "Model and training (GraphSAGE as DGL's distributed tutorial, RGCN as its "
             "distributed rgcn example)."), [
        Setting("epochs", "int", 5, "Training epochs.", TRAINER, JOB, flag="--num-epochs", minimum=1),
        Setting("batch_size", "int", 256, "Seed nodes per mini-batch and trainer.", TRAINER, JOB, minimum=1),
        Setting("fan_out", "list", [10, 25], "Neighbours sampled per layer, one value per layer (-1: all).",
                TRAINER, JOB),
        Setting("layers", "int", 2, "GraphSAGE or RGCN layers.", TRAINER, JOB, flag="--num-layers", minimum=1),
        Setting("hidden", "int", 64, "Hidden units of GraphSAGE or RGCN.", TRAINER, JOB, flag="--num-hidden", minimum=1),
        Setting("dropout", "float", 0.5, "Dropout between the layers.", TRAINER, JOB, minimum=0, below=1),
        Setting("lr", "float", 0.01, "Adam learning rate.", TRAINER, JOB, above=0),
        Setting("weight_decay", "float", 0.0, "L2 penalty (weight decay) of the Adam optimizer.", TRAINER, JOB, minimum=0),
        Setting("seed", "int", 0, "Seed of torch, numpy, random and DGL's samplers on servers and trainers.",
                TRAINER, JOB, minimum=0),
        Setting("sparse_lr", "float", 0.01,
                "RGCN only: learning rate of the learnt embeddings of featureless node types (SparseAdam).",
                TRAINER, JOB, above=0),
        Setting("link_val_frac", "float", 0.05,
                "Link prediction only: share of node pairs held out of the graph for validation.", DATASET, PARTITION,
                above=0, below=1),
        Setting("link_test_frac", "float", 0.05,
                "Link prediction only: share of node pairs held out of the graph for testing.", DATASET, PARTITION,
                above=0, below=1),
        Setting("num_negs", "int", 5,
                "Link prediction only: uniformly sampled negative edges per positive edge in training.", TRAINER, JOB, minimum=1),
        Setting("eval_negs", "int", 100,
                "Link prediction only: negatives each held-out edge is ranked against (MRR, hits@1/3/10).",
                TRAINER, JOB, minimum=1),
    ]),
    (Section("Processes", "Processes on every worker: DGL servers, trainers, and sampler processes per trainer (0: the "
             "trainer\nsamples itself). GraphBolt sampling also converts the partition (once)."), [
        Setting("servers", "int", 1, "DGL servers per worker.", LAUNCHER, JOB, minimum=1, key="num_servers"),
        Setting("trainers", "int", 1, "Trainer processes per worker.", LAUNCHER, JOB, minimum=1, key="num_trainers"),
        Setting("samplers", "int", 0, "Sampler processes per trainer (0 samples inside the trainer).", LAUNCHER, JOB,
                minimum=0, key="num_samplers"),
        Setting("server_threads", "int", 1, "OMP threads of each server.", LAUNCHER, JOB, minimum=0),
        Setting("trainer_threads", "int", 0, "OMP threads of each trainer; 0 picks max(cpus // 2 // trainers, 1).",
                LAUNCHER, JOB, minimum=0),
        Setting("graphbolt", "bool", False, "Sample with GraphBolt (the partition gets a GraphBolt graph too); not "
                "with link_prediction (DGL 2.1's GraphBolt samples nodes only).",
                TRAINER, JOB),
        Setting("memory_max", "str", "",
                "MemoryMax= of the job unit on each worker (e.g. 48G, or 80% of the node's memory); empty for none. "
                "Needs the memory cgroup controller.", PLAYBOOK, pattern=MEMORY_MAX),
        Setting("cpu_quota", "str", "",
                "CPUQuota= of the job unit on each worker (e.g. 400% for four cores); empty for none.", PLAYBOOK,
                pattern=CPU_QUOTA),
        Setting("master_port", "int", 29500,
                "torch.distributed rendezvous port on the first worker (the DGL server ports are "
                "dglkit_server_port + s).", LAUNCHER, **PORT),
    ]),
    (Section("Liveness", "Liveness. The kit's trainers beat a heartbeat (also while evaluating, inferring and saving); "
             "one that has\nnot changed for stall_timeout seconds, judged by the launcher's own clock, stops the job. "
             "Programs that\nnever beat are never judged stalled. A node whose status.json is older than stale_after "
             "seconds (by the\nshared filesystem's clock, so a host whose clock is off does not count) is down."), [
        Setting("stall_timeout", "int", 120,
                "Seconds a trainer's heartbeat may stay unchanged before the job is stopped (programs that never beat "
                "are not judged).", LAUNCHER, minimum=10),
        Setting("stale_after", "int", 120,
                "Seconds after which a node whose status.json is not refreshed (by the shared filesystem's clock) "
                "counts as down.", LAUNCHER, minimum=10),
    ]),
    (Section("Checkpoints and restarts", "Long jobs. The trainers checkpoint every N epochs and after the last "
             "(<job dir>/checkpoint.pt: model,\noptimizer, epoch, RNG state, metrics). After a failure the nodes' "
             "launchers stop the job everywhere and start\nit again from the checkpoint, up to max_restarts times, "
             "each attempt's logs kept in attempts/<n>/; they wait\nup to restart_wait seconds for every node first "
             "(a node still down then is gone: the job fails, naming it). 0\nrestarts: the first failure ends the job. Running a "
             "failed or stopped job again starts over, keeping the earlier\nrun in history/<k>/; with dgl_job_resume "
             "it continues from the checkpoint instead."), [
        Setting("checkpoint_every", "int", 1, "The trainers write checkpoint.pt every N epochs and after the last (0 "
                "never).", TRAINER, minimum=0),
        Setting("max_restarts", "int", 2, "Restarts from the last checkpoint after a failure, coordinated by the "
                "nodes' launchers (0 fails at the first failure).", LAUNCHER, minimum=0),
        Setting("restart_wait", "int", 300, "Seconds the launchers wait for every node before a restart; a node not "
                "back by then fails the job, naming it.", LAUNCHER, minimum=10),
        Setting("resume", "bool", False, "Running a failed or stopped job again continues from its checkpoint "
                "instead of starting over.", PLAYBOOK),
        Setting("ssh_retries", "int", 10, "SSH attempts (with backoff up to 30 s each) for each poll of a running "
                "job before the watch gives up.", PLAYBOOK, sample=None, minimum=0),
        Setting("poll_seconds", "int", 30, "Longest wait of one `dglkit watch` poll; it returns earlier when the job "
                "changes.", PLAYBOOK, sample=None, minimum=1),
        Setting("progress_seconds", "int", 5, "Shortest time between two progress lines of a running job (each line "
                "is a poll: a round trip and a Python start on the storage host); a change of state is reported at "
                "once. Also the longest wait of one poll of the dataset's prepare and partition (at least 1 s).",
                PLAYBOOK, sample=None, minimum=0),
    ]),
    (Section("Job id and results", "Job id: empty derives it from the settings and the partition, so the same job run "
             "twice is found\nfinished the second time (nothing runs, changed=0). Set dgl_job_force: true to run it "
             "again anyway.\nResults on the controller: <run dir>/<job id>/ gets logs, status, metrics, summary and "
             "curves."), [
        Setting("id", "str", "", "Job id; empty derives it from the settings and the partition.", PLAYBOOK),
        Setting("force", "bool", False, "Run again even when the job's finished result exists.", PLAYBOOK),
        # The directory ansible-playbook runs in: a clone's root, or the project of the installed collection's user
        # (the collection's own playbook directory is no place for results).
        Setting("run_dir", "path", "{{ 'runs' | ansible.builtin.realpath }}",
                "Controller directory that receives <job id>/ with logs, metrics, summary and TensorBoard curves.",
                PLAYBOOK, shown="<current directory>/runs", sample="comment", example="/path/to/runs"),
        Setting("save_embeddings", "bool", False,
                "Write and fetch node embeddings (embeddings.npy, all nodes in original order; large).", TRAINER, JOB),
        Setting("save_predictions", "bool", False,
                "Write and fetch predictions for all nodes (predictions.npy, original order).", TRAINER, JOB),
        Setting("fetch_model", "bool", False, "Fetch model.pt too.", PLAYBOOK),
    ]),
    (Section("Your own program", (
        "Your own program instead of the kit's GraphSAGE trainer (roles/dgl_program): a directory on this machine\n"
        "(scripts, modules, optionally requirements.txt) and the command that starts it, exactly as you would give it\n"
        "to DGL's tools/launch.py. Servers and trainers run the command as it is, with launch.py's environment (a\n"
        "trainer's: torchrun's RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, ...). The dataset settings\n"
        "above still decide the graph: the kit prepares and partitions it, and fills in the placeholders:\n"
        "  {graph_name} {ip_config} {part_config}   the partition and the cluster's ip_config.txt\n"
        "  {output_dir}                             what the program writes there comes back to runs/<job id>/\n"
        "                                           (also in $DGLKIT_OUTPUT_DIR); metrics.jsonl in the kit's format\n"
        "                                           gets summary.txt and curves.png (docs/design.md)\n"
        "  {num_machines} {machine_id} {num_servers} {num_trainers} {num_samplers}   per machine\n"
        "  {job_dir} {program_dir} {node_name}\n"
        "Ansible variables work too: --num_epochs {{ dgl_job_epochs }}. ${NAME} is left to the shell.\n"
        "requirements.txt is installed (from the wheelhouse when offline) into an environment of the program's own,\n"
        "layered on the node venv: torch, DGL and the other node packages stay as pinned; a requirement that\n"
        "conflicts with them, or is missing from the wheelhouse, fails the job before anything starts.\n"
        "The copy on the workspace is <workspace>/programs/<name>-<hash of its files>/: an unchanged program is not\n"
        "copied again, a changed one is a new version (and a new job id); job.json records the version a job ran.\n"
        "dgl_program_dir: ~/projects/graphsage-dist\n"
        "dgl_program_command: >-\n"
        "  python3 train_dist.py --graph_name {graph_name} --ip_config {ip_config} --part_config {part_config}\n"
        "  --num_epochs 10 --output_dir {output_dir}\n"
        "dgl_program_name: \"\"    # name of the copy; default: the directory's name\n"
        "The command runs from the job directory, as launch.py runs it from its --workspace: what the program writes to\n"
        "relative paths (emb.pt, checkpoints) comes back to runs/<job id>/; its script is found in its copy.\n"
        "The partition's node data are feat, labels, train_mask, val_mask, test_mask (DGL's tutorial). A program that\n"
        "reads other names (DGL's distributed examples read features) gets them served under its names, nothing copied:"
    )), [
        Setting("node_data_names", "dict", {},
                "Your program's names for the partition's node data (feat, labels, train_mask, val_mask, test_mask), "
                "as DGL's servers serve them (no copy): {feat: features} renames feat on every node type, "
                "{paper: {feat: features}} on one. Only with dgl_program_dir; a name the partition does not have "
                "fails before anything starts.", LAUNCHER, JOB, sample="comment",
                example={"feat": "features"}),
        Setting("program", "dict", {},
                "The user's program to run instead of the kit's trainer, as the dgl_program role shipped it (id, "
                "dir, python_env, command); set by playbooks/vars/dgl_job.yml from dgl_program_dir.", LAUNCHER, JOB,
                sample=None),
    ]),
    (Section("Plumbing", "Plumbing, set by the playbooks from the kit-wide dglkit_* variables."), [
        Setting("workspace", "path", "/srv/dglkit", "Shared workspace (dglkit_workspace).", PLAYBOOK, sample=None),
        Setting("venv", "path", "{{ dgl_job_workspace }}/venv", "Node venv (dglkit_venv_dir).", PLAYBOOK,
                shown="<workspace>/venv", sample=None),
        Setting("server_port", "int", 30050, "First DGL server port (dglkit_server_port).", LAUNCHER, sample=None, **PORT),
        Setting("user", "str", "dglkit", "Unprivileged account that runs every job process and owns the job's files "
                "(dglkit_user).", PLAYBOOK, sample=None),
        Setting("ssh_mesh", "bool", False, "The job account's SSH between the nodes (dglkit_ssh_mesh): "
                "dgl_job_partition_builder mpi needs it.", PLAYBOOK, sample=None),
        Setting("mpi", "bool", False, "Open MPI and PT-Scotch on the workers (dglkit_mpi): dgl_job_partition_builder "
                "mpi needs them.", PLAYBOOK, sample=None),
    ]),
]

SETTINGS: dict[str, Setting] = {s.name: s for _, group in SECTIONS for s in group}


# The launcher's numbers (job.json keys, its long flags), by their key there.
LAUNCHER_NUMBERS: dict[str, Setting] = {s.launch_key: s for s in SETTINGS.values()
                                        if s.reader == LAUNCHER and s.type in ("int", "float")}


def defaults(reader: str | None = None) -> dict[str, Any]:
    """Declared defaults by short name, of one reader's settings or of all."""
    return {s.name: s.default for s in SETTINGS.values() if reader in (None, s.reader)}


# The generated files, relative to the repository, and the markers of the part of a file that is generated.
DEFAULTS_FILE = "roles/dgl_job/defaults/main.yml"
SPECS_FILE = "roles/dgl_job/meta/argument_specs.yml"
SAMPLE_FILE = "inventory/sample/group_vars/all/job.yml"
DOCS_FILE = "docs/settings.md"
TABLE_BEGIN, TABLE_END = "<!-- settings-table:begin -->", "<!-- settings-table:end -->"
GENERATED = "generated from app/dglkit/settings.py by `make settings`: change them there"


# Variables of other roles (and the kit-wide dglkit_* that feed a setting) that take a setting's default: their
# default is generated too, so that it is written once, here. (variable, setting), by file.
MIRRORS: dict[str, list[tuple[str, str]]] = {
    **{f"roles/dgl_dataset/{name}": [(f"dgl_dataset_{setting}", setting) for setting in (
        "synthetic_nodes", "synthetic_degree", "synthetic_classes", "synthetic_feat_dim", "synthetic_seed",
        "ogb_download", "files_path", "partition_builder", "graphbolt")]
       for name in ("defaults/main.yml", "meta/argument_specs.yml")},
    **{f"roles/dgl_job_control/{name}": [("dgl_job_control_master_port", "master_port"),
                                         ("dgl_job_control_server_port", "server_port")]
       for name in ("defaults/main.yml", "meta/argument_specs.yml")},
    **{f"roles/firewall/{name}": [("firewall_rendezvous_port", "master_port"), ("firewall_server_port", "server_port")]
       for name in ("defaults/main.yml", "meta/argument_specs.yml")},
    "roles/dglkit_defaults/defaults/main.yml": [("dglkit_server_port", "server_port")],
    "roles/cluster_validate/meta/argument_specs.yml": [("cluster_validate_server_port", "server_port")],
    "inventory/sample/group_vars/all/cluster.yml": [("dglkit_server_port", "server_port")],
}


def render_mirrors(name: str, current: str) -> str:
    """A file of MIRRORS with each of its variables' default as declared: `var: value` in a defaults file, the
    `default:` of the variable's entry in an argument spec."""
    for var, setting in MIRRORS[name]:
        value = yaml_value(SETTINGS[setting].default)
        if "argument_specs" in name:
            entry = re.compile(rf"^(( +){var}:\n(?:\2 +.*\n)*?\2 +default: ).*$", re.M)
        else:
            entry = re.compile(rf"^({var}: ).*$", re.M)
        current, found = entry.subn(lambda m: m.group(1) + value, current, count=1)  # noqa: B023 (used at once)
        if not found:
            raise ValueError(f"{name}: no {var} to write the default of {PREFIX}{setting} to")
    return current


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[2],
                        help="the repository (default: the one this file is in)")
    parser.add_argument("--write", action="store_true", help="rewrite the files that differ from the declaration")


def yaml_value(value: Any) -> str:
    """A flow-style YAML value; strings plain where YAML reads them back as the same string."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(map(yaml_value, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {yaml_value(v)}" for k, v in value.items()) + "}"
    plain = re.fullmatch(r"[A-Za-z/<][A-Za-z0-9_./<> -]*", value) and value.lower() not in (
        "true", "false", "yes", "no", "on", "off", "null", "y", "n") and not value.endswith(" ")
    return value if plain else json.dumps(value)


def comment(text: str, width: int = 110) -> list[str]:
    return ["# " + line if line else "#" for para in text.split("\n")
            for line in (textwrap.wrap(para, width - 2) or [""])]


def render_defaults() -> str:
    lines = ["---", f"# The dgl_job role's settings, {GENERATED}.",
             f"# docs/settings.md explains each; {SAMPLE_FILE} is the users' copy."]
    for section, group in SECTIONS:
        lines += ["", f"# {section.title}"]
        for setting in group:
            lines += comment(setting.help) + [f"{setting.var}: {yaml_value(setting.default)}"]
    return "\n".join(lines) + "\n"


def render_options(indent: str = "      ") -> str:
    lines = []
    for setting in SETTINGS.values():
        lines += [f"{indent}{setting.var}:", f"{indent}  type: {setting.type}"]
        if setting.type == "list":
            lines.append(f"{indent}  elements: {setting.elements}")
        shown = setting.shown if setting.shown is not None else setting.default
        lines.append(f"{indent}  default: {yaml_value(shown)}")
        if setting.choices:
            lines.append(f"{indent}  choices: {yaml_value(list(setting.choices))}")
        lines.append(f"{indent}  description: >-")
        lines += [f"{indent}    {line}" for line in textwrap.wrap(setting.help, 110 - len(indent) - 4)]
    return "\n".join(lines) + "\n"


def render_specs(current: str) -> str:
    """argument_specs.yml with the options of the main entry generated, the rest as it is."""
    main = re.compile(r"(\n    options: &options\n)(.*?)(?=\n  [a-z_]+:\n)", re.S)
    return main.sub(lambda m: m.group(1) + render_options().rstrip("\n"), current, count=1)


def render_sample() -> str:
    lines = ["# The training job that playbooks/train.yml runs (roles/dgl_job). Override any of these for one run with",
             "# -e, e.g. ansible-playbook -i inventory/mycluster playbooks/train.yml -e dgl_job_epochs=10",
             f"# The settings are {GENERATED};", "# docs/settings.md lists them all."]
    for section, group in SECTIONS:
        shown = [s for s in group if s.sample]
        if not shown:
            continue
        lines += [""] + comment(section.comment)
        for setting in shown:
            value = setting.example if setting.example is not None else setting.default
            lines += comment(setting.help)
            lines.append(("# " if setting.sample == "comment" else "") + f"{setting.var}: {yaml_value(value)}")
    return "\n".join(lines) + "\n"


def render_table() -> str:
    lines = ["| setting | default | changes the job id | read by | |", "|---|---|---|---|---|"]
    for setting in SETTINGS.values():
        shown = setting.shown if setting.shown is not None else json.dumps(setting.default)
        choices = f" One of {', '.join(setting.choices)}." if setting.choices else ""
        identity = {JOB: "yes", PARTITION: "yes (another partition)"}.get(setting.identity or "", "no")
        bounds = f" A value {setting.bounds_text()}." if setting.bounds() else ""
        lines.append(f"| `{setting.var}` | `{shown}` | {identity} | {setting.reader} | {setting.help}{choices}{bounds} |")
    return "\n".join(lines) + "\n"


def render_docs(current: str | None) -> str:
    if current is None:
        current = f"# Job settings\n\n{TABLE_BEGIN}\n{TABLE_END}\n"
    start, end = current.index(TABLE_BEGIN) + len(TABLE_BEGIN), current.index(TABLE_END)
    return current[:start] + f"\n<!-- {GENERATED} -->\n" + render_table() + current[end:]


def rendered(root: Path) -> dict[str, str]:
    """Each generated file's content as the declaration makes it."""
    def read(name: str) -> str | None:
        path = root / name
        return path.read_text() if path.exists() else None

    return {DEFAULTS_FILE: render_defaults(), SPECS_FILE: render_specs(read(SPECS_FILE) or ""),
            SAMPLE_FILE: render_sample(), DOCS_FILE: render_docs(read(DOCS_FILE)),
            **{name: render_mirrors(name, read(name) or "") for name in MIRRORS}}


def run(args: argparse.Namespace) -> int:
    drifted = []
    for name, text in rendered(args.root).items():
        path = args.root / name
        if not path.exists() or path.read_text() != text:
            drifted.append(name)
            if args.write:
                path.write_text(text)
    verb = "rewrote" if args.write else "differ from app/dglkit/settings.py (make settings rewrites them):"
    if drifted:
        print(verb, ", ".join(drifted), file=sys.stderr if not args.write else sys.stdout)
    return 1 if drifted and not args.write else 0
