"""Node data under the names a program reads (job setting `node_data_names`).

The kit's partitions store node data as DGL's tutorial names it (`feat`, `labels`, `train_mask`, ...); DGL's
distributed examples read `features`. DGL's servers serve each partition's node data under its key in the
part's node_feat.dgl (`<node type>/<name>`), and that is the only place a name is decided: the job's servers
(dglkit/jobsite/sitecustomize.py) rename the keys as they load them, so the data is neither copied on disk nor
in memory, and one partition serves programs that read either name.
"""
import json
import struct
from pathlib import Path

from dglkit.common import UserError, read_partition_config

# dgl.data.utils.save_tensors: magic, count, then a vector of (name, NDArray) pairs (DGL's
# graph/serialize/tensor_serialize.cc and runtime/ndarray.cc).
TENSORS_MAGIC = 0xDD5A9FBE3FA2443F
NDARRAY_MAGIC = 0xDD5E40F096B4A13F
ENV = "DGLKIT_NODE_DATA_NAMES"


def tensor_names(path: Path) -> list[str]:
    """The keys of a save_tensors file, read by skipping over the arrays (a part's features may be gigabytes)."""
    with open(path, "rb") as f:
        magic, _, count = struct.unpack("<QQQ", f.read(24))
        if magic != TENSORS_MAGIC:
            raise UserError(f"{path} is not a DGL tensor file")
        names = []
        for _ in range(count):
            (length,) = struct.unpack("<Q", f.read(8))
            names.append(f.read(length).decode())
            magic, _, _, ndim = struct.unpack("<QQQi", f.read(28))
            if magic != NDARRAY_MAGIC:
                raise UserError(f"{path}: unexpected array header after {names[-1]!r}")
            f.seek(4 + 8 * ndim, 1)  # dtype, shape
            (size,) = struct.unpack("<q", f.read(8))
            f.seek(size, 1)
    return names


def partition_node_data(part_config: Path) -> dict[str, list[str]]:
    """{node type: its node data names} as part 0 stores them (every part has the same names)."""
    config = read_partition_config(part_config)
    part = config.get("part-0", {})
    types: dict[str, list[str]] = {name: [] for name in config.get("ntypes", {"_N": 0})}
    if "node_feats" in part:
        for key in tensor_names(part_config.parent / part["node_feats"]):
            ntype, _, name = key.rpartition("/")
            types.setdefault(ntype or "_N", []).append(name)
    return types


def served_names(part_config: Path, names: dict) -> dict[str, str]:
    """{stored key: served key} for the job setting: {"feat": "features"} renames `feat` of every node type that
    has it, {"paper": {"feat": "features"}} that of one type (it wins over the first form)."""
    if not names:
        return {}
    stored = partition_node_data(part_config)
    listing = "; ".join(f"{ntype}: {', '.join(have) or '(none)'}" for ntype, have in stored.items())
    if not isinstance(names, dict):
        raise UserError(f"node data names {json.dumps(names)}: give a mapping, e.g. {{\"feat\": \"features\"}}")
    # ntype None: no node type has `old` (reported below, with the names the partition has).
    pairs: list[tuple[str | None, str, object]] = [
        (ntype, old, new) for old, new in names.items() if not isinstance(new, dict)
        for ntype in [t for t, have in stored.items() if old in have] or (None,)]
    for ntype, renames in names.items():
        if isinstance(renames, dict):
            if ntype not in stored:
                raise UserError(f"node data names: the partition has no node type {ntype!r}; it has {listing}")
            pairs += [(ntype, old, new) for old, new in renames.items()]
    served = {}
    for ntype, old, new in pairs:
        if not (isinstance(new, str) and new and "/" not in new):
            raise UserError(f"node data names: {old!r} -> {json.dumps(new)}: the name a program reads is a "
                            "non-empty string without '/'")
        if ntype is None or old not in stored[ntype]:
            raise UserError(f"node data names: the partition has no node data {old!r}"
                            f"{'' if ntype is None else f' on node type {ntype!r}'}; it has {listing}")
        served[f"{ntype}/{old}"] = f"{ntype}/{new}"
    for ntype, have in stored.items():
        keys = [served.get(f"{ntype}/{name}", f"{ntype}/{name}") for name in have]
        twice = sorted({key for key in keys if keys.count(key) > 1})
        if twice:
            raise UserError(f"node data names: node type {ntype!r} would serve {', '.join(twice)} twice; "
                            f"it has {', '.join(have)}")
    return served
