"""The dataset kinds: which names exist and whether their graph is heterogeneous.

Standard library only: `dglkit plan` asks it on the controller before anything starts, `dglkit prepare` on the
storage host. A files dataset is heterogeneous when its directory has num_nodes.json (dglkit.hetero); only
its partition's metadata tells, so `dglkit launch --check` decides there (dglkit.train.task_module).
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
OGB = Kind("ogb", False)
# The OGB node-property datasets whose graph has several node types (ogb's master.csv, "is hetero").
OGB_HETERO = Kind("ogb", True)
HETERO_OGB_NAMES = {"ogbn-mag"}


def kind(dataset: str) -> Kind | None:
    """The kind of a dataset name, None for a name the kit does not know."""
    if re.fullmatch(r"ogbn-[a-z0-9]+", dataset):
        return OGB_HETERO if dataset in HETERO_OGB_NAMES else OGB
    return {k.name: k for k in (SYNTHETIC, SYNTHETIC_HETERO, FILES)}.get(dataset)


def heterogeneous(dataset: str) -> bool | None:
    """True or False when the name decides, None when the data do (files) or the name is unknown."""
    found = kind(dataset)
    return found.heterogeneous if found else None
