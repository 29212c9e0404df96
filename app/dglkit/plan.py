"""`dglkit plan`: the job's settings checked, its id derived and its files' content, before anything changes.

Standard library only: roles/dgl_job runs it once on the controller with Ansible's Python. It reads one JSON
object, --request {"settings": {"dgl_job_<name>": value, ...}, "workers": [...], "partition": {"id", "slug",
"part_config"}}, and prints one: {"errors": [...], "settings", "run_settings", "job_id", "job_dir", "config"}.
With errors, the rest is left out. Ids are pure functions of the settings and the partition: a re-run finds
what an earlier run made.
"""

import argparse
import hashlib
import json
import re
from typing import Any

from dglkit import kinds
from dglkit.settings import JOB, LAUNCHER_NUMBERS, PREFIX, SETTINGS, TRAINER, Setting, fan_out_problem, parse_fan_out

TRUE = {"true", "yes", "on", "1", "y", "t"}
FALSE = {"false", "no", "off", "0", "n", "f", ""}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.split("\n\n")[0]
    # An argument, not stdin: the role runs it through a pipe lookup, which costs no task of its own.
    parser.add_argument("--request", type=json.loads, required=True,
                        help='{"settings": {"dgl_job_<name>": value, ...}, "workers": [...], "partition": {...}}')


def coerce(setting: Setting, value: Any) -> Any:
    """The value as its declared type, as Ansible's argument specs accept it (-e gives strings); ValueError."""
    kind = setting.type
    if kind == "int":
        if isinstance(value, bool) or isinstance(value, float) and not value.is_integer():
            raise ValueError
        return int(value.strip() if isinstance(value, str) else value)
    if kind == "float":
        if isinstance(value, bool):
            raise ValueError
        return float(value)
    if kind == "bool":
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text not in TRUE | FALSE:
            raise ValueError
        return text in TRUE
    if kind == "list":
        return parse_fan_out(value)
    if kind == "dict":
        if not isinstance(value, dict):
            raise ValueError
        return value
    return "" if value is None else str(value)


def typed(given: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Every declared setting by short name, the given value coerced, else the default."""
    values, errors = {}, []
    for setting in SETTINGS.values():
        value = given.get(setting.var, setting.default)
        try:
            values[setting.name] = coerce(setting, value)
        except (TypeError, ValueError):
            errors.append(f"{setting.var}={text(value)}: use a value of type {setting.type}")
            continue
        if setting.choices and values[setting.name] not in setting.choices:
            errors.append(f"value of {setting.var} must be one of: {', '.join(setting.choices)}, got: {text(value)}")
    return values, errors


def text(value: Any) -> str:
    """A value as Jinja prints it in a message."""
    return value if isinstance(value, str) else json.dumps(value) if isinstance(value, dict) else str(value)


def check(s: dict[str, Any], given: dict[str, Any]) -> list[str]:
    """The job settings' rules, in the order their messages are joined."""
    def raw(name: str) -> str:
        return text(given.get(PREFIX + name, SETTINGS[name].default))

    dataset, task = s["dataset"], s["task"]
    hetero = kinds.heterogeneous(dataset)
    job_id = s["id"]
    names = s["node_data_names"]
    fan_out = fan_out_problem(s["fan_out"], s["layers"])
    bounds = [(True, f"{setting.var}={raw(name)}: {problem}") for name, setting in SETTINGS.items()
              for problem in [setting.problem(s[name])] if problem]
    rules = bounds + [
        (kinds.kind(dataset) is None,
         f"dgl_job_dataset={dataset}: use synthetic, synthetic-hetero, files, chunked or an ogbn-* name such as "
         "ogbn-products or ogbn-mag"),
        (task == "link_prediction" and hetero is True,
         f"dgl_job_task=link_prediction runs on homogeneous graphs; {dataset} is heterogeneous (use "
         "dgl_job_task=node_classification, which trains RGCN on it)"),
        (s["graphbolt"] and hetero is True,
         "dgl_job_graphbolt=true: the RGCN trainer of heterogeneous graphs samples with DGL's own sampler"),
        # DGL 2.1's distributed GraphBolt samples nodes alone: the edge loader calls find_edges, which it refuses.
        (task == "link_prediction" and s["graphbolt"] and not s["program"],
         "dgl_job_task=link_prediction with dgl_job_graphbolt=true: DGL 2.1's GraphBolt samples nodes only, not the "
         "edges link prediction trains on (find_edges is not supported in GraphBolt); set dgl_job_graphbolt=false"),
        # Held-out edges are drawn from the whole edge list, which no host reads of a chunked graph (prepare refuses).
        (task == "link_prediction" and (dataset == "chunked" or (dataset == "synthetic"
                                                                 and s["partition_builder"] == "mpi")),
         "dgl_job_task=link_prediction holds validation and test edges out of the whole graph, which the kit never "
         "reads on one host in DGL's chunked format (dgl_job_dataset=chunked, or synthetic with "
         "dgl_job_partition_builder=mpi): use dgl_job_task=node_classification, or a files or synthetic dataset with "
         "another builder"),
        (task == "link_prediction" and s["link_val_frac"] + s["link_test_frac"] >= 1,
         "dgl_job_link_val_frac and dgl_job_link_test_frac must have a sum < 1"),
        (dataset == "files" and not s["files_path"],
         "dgl_job_dataset=files needs dgl_job_files_path (a .npz file or a directory on the storage host)"),
        (dataset == "chunked" and not s["chunked_path"],
         "dgl_job_dataset=chunked needs dgl_job_chunked_path (the directory of its metadata.json on the shared workspace)"),
        (bool(job_id) and not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", job_id),
         f"dgl_job_id={job_id}: " + ("'.' and '..' are not names" if job_id in (".", "..") else
                                     "use letters, digits, ., _ and - only, starting with a letter or digit")
         + " (it names a directory)"),
        (bool(fan_out), f"dgl_job_fan_out={','.join(map(str, s['fan_out']))}: {fan_out} (dgl_job_layers={s['layers']})"),
        (bool(names) and not s["program"],
         "dgl_job_node_data_names names node data for your own program: set dgl_program_dir and dgl_program_command "
         "too (the kit's trainer reads the kit's names)"),
        (any(not isinstance(v, (str, dict)) for v in names.values()),
         f"dgl_job_node_data_names={text(names)}: map a node data name to the name your program reads "
         "({feat: features}), or a node type to such a mapping ({paper: {feat: features}})"),
        (s["server_port"] <= s["master_port"] < s["server_port"] + s["servers"],
         f"dgl_job_master_port={raw('master_port')} collides with the DGL server ports: pick another port"),
    ]
    return [message for bad, message in rules if bad]


def mpi_errors(s: dict[str, Any]) -> list[str]:
    """What the mpi builder needs of the cluster site.yml set up: mpirun reaches the other workers over the job
    account's SSH mesh and runs on the packages dglkit_mpi installs."""
    if s["partition_builder"] != "mpi":
        return []
    missing = [f"dglkit_{name}: true" for name in ("mpi", "ssh_mesh") if not s[name]]
    # synthetic-hetero is written chunk by chunk on the workers (as synthetic is); ogbn-mag would be prepared
    # as arrays, which hold one node type.
    hetero = kinds.heterogeneous(s["dataset"]) and s["dataset"] != "synthetic-hetero"
    return ([f"dgl_job_partition_builder=mpi runs mpirun across the workers: set {' and '.join(missing)} in the "
             "inventory and run site.yml (Open MPI and PT-Scotch on the workers, the job account's SSH between them)"]
            if missing else []) + (
        [f"dgl_job_partition_builder=mpi reads a heterogeneous graph in DGL's chunked format only; {s['dataset']} is "
         "heterogeneous and would be prepared as arrays (one node type): write it in the chunked format "
         "(dgl_job_dataset: chunked) or use dgl_job_partition_builder=lean"] if hetero else [])


def job_settings(s: dict[str, Any]) -> dict[str, Any]:
    """What makes a job's result, as hashed into its id: node_data_names only when set, so that the ids of jobs
    without it stay what they were (a setting added later goes in the same way)."""
    return {n: s[n] for n, setting in SETTINGS.items()
            if setting.identity == JOB and (n != "node_data_names" or s[n])}


def job_id(s: dict[str, Any], partition: dict[str, str], workers: int) -> str:
    if s["id"]:
        return str(s["id"])
    digest = hashlib.sha1(json.dumps({"partition": partition["id"], "settings": job_settings(s)},
                                     sort_keys=True).encode()).hexdigest()[:10]
    program = re.sub(r"-[0-9a-f]+$", "-", s["program"]["id"]) if s["program"] else ""
    return f"{program}{partition['slug']}-{workers}w-{digest}"


def trainer_settings(s: dict[str, Any]) -> dict[str, Any]:
    """job.json's "train": the kit's trainer reads its settings there (`dglkit train --settings`)."""
    return {setting.dest: setting.train_value(s[n]) for n, setting in SETTINGS.items() if setting.reader == TRAINER}


def launcher_config(s: dict[str, Any], job_dir: str, part_config: str, workers: list[str]) -> dict[str, Any]:
    """job.json: `dglkit launch --config`, whose keys are launch's long flag names."""
    config = {
        "job_dir": job_dir, "ip_config": f"{s['workspace']}/ip_config.txt", "part_config": part_config,
        # The server port is ip_config's (each line's); the launcher's flag is for --local.
        **{key: s[setting.name] for key, setting in LAUNCHER_NUMBERS.items() if key != "server_port"},
        "trainer_threads": s["trainer_threads"] or None, "nodes": workers,
        "train": trainer_settings(s), "train_args": ["--settings", f"{job_dir}/job.json"],
    }
    if s["program"]:
        program = s["program"]
        config.update(command=program["command"], program_dir=program["dir"], python_env=program["python_env"],
                      train={}, train_args=[], node_data_names=s["node_data_names"])
    return config


def plan(request: dict[str, Any]) -> dict[str, Any]:
    given, workers, partition = request["settings"], request["workers"], request["partition"]
    s, errors = typed(given)
    if errors:
        return {"errors": errors}
    errors = check(s, given) + mpi_errors(s)
    if errors:
        return {"errors": errors}
    job = job_id(s, partition, len(workers))
    job_dir = f"{s['workspace']}/jobs/{job}"
    settings = job_settings(s)
    return {
        "errors": [],
        "settings": settings,
        "run_settings": {**settings, "partition": partition["id"]},
        "job_id": job,
        "job_dir": job_dir,
        "config": launcher_config(s, job_dir, partition["part_config"], workers),
    }


def run(args: argparse.Namespace) -> int:
    print(json.dumps(plan(args.request), sort_keys=True))
    return 0
