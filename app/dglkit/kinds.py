"""The dataset kinds: which names exist and whether their graph is heterogeneous.

Standard library only: `dglkit plan` asks it on the controller before anything starts, `dglkit prepare` on the
storage host. A files dataset is heterogeneous when its directory has num_nodes.json (dglkit.hetero), a chunked
one when its metadata.json lists several node or edge types; only
its partition's metadata tells, so `dglkit launch --check` decides there, before anything starts.
"""

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Kind:
    name: str  # synthetic, synthetic-hetero, files or ogb
    heterogeneous: bool | None  # None: the data decide


SYNTHETIC = Kind("synthetic", False)
SYNTHETIC_HETERO = Kind("synthetic-hetero", True)
FILES = Kind("files", None)
# A graph in DGL's chunked format (dglkit.chunked) that stays where it is: its metadata.json tells.
CHUNKED = Kind("chunked", None)
OGB = Kind("ogb", False)
# The OGB node-property datasets whose graph has several node types (ogb's master.csv, "is hetero").
OGB_HETERO = Kind("ogb", True)
HETERO_OGB_NAMES = {"ogbn-mag"}


# (task, heterogeneous graph?) -> the dglkit module that trains it (dglkit.train.TASK_MODULES); a combination
# not here does not run.
TASKS = {
    ("node_classification", False): "sage",
    ("node_classification", True): "rgcn",
    ("link_prediction", False): "linkpred",
}


def kind(dataset: str) -> Kind | None:
    """The kind of a dataset name, None for a name the kit does not know."""
    if re.fullmatch(r"ogbn-[a-z0-9]+", dataset):
        return OGB_HETERO if dataset in HETERO_OGB_NAMES else OGB
    return {k.name: k for k in (SYNTHETIC, SYNTHETIC_HETERO, FILES, CHUNKED)}.get(dataset)


def heterogeneous(dataset: str) -> bool | None:
    """True or False when the name decides, None when the data do (files) or the name is unknown."""
    found = kind(dataset)
    return found.heterogeneous if found else None


def partition_heterogeneous(config: dict) -> bool:
    """DGL's partition config lists node types; a homogeneous graph has the one type '_N'."""
    return list(config.get("ntypes", {"_N": 0})) != ["_N"]


def task_error(task: str, config: dict, part_config: object) -> str | None:
    """Why `task` does not run on this partition (config: its json), or None when it does."""
    hetero = partition_heterogeneous(config)
    if (task, hetero) in TASKS:
        return None
    other = " or ".join(name for name, on_hetero in TASKS if on_hetero == hetero)
    return (f"{part_config} is a {'heterogeneous' if hetero else 'homogeneous'} graph: --task {task} does not run "
            f"on it; use --task {other}")
