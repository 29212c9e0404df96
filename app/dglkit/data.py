"""`dglkit prepare`: one DGL graph with node features, labels and split masks.

Sources: an OGB node-property dataset (offline from pre-placed files), a seeded synthetic community graph,
or the user's own arrays; heterogeneous graphs (synthetic-hetero, ogbn-mag, files with num_nodes.json) are
described in dglkit.hetero. The output is DIR/graph.dgl (ndata feat float32, labels int64, train_mask,
val_mask, test_mask bool, which DGL's file format stores and loads as 0/1 uint8) and DIR/dataset.json,
whose fingerprint identifies the inputs: a re-run with the same inputs is a no-op, and `dglkit partition`
records it to tell whether a partition is still current. With --arrays, DIR/arrays/ holds the same graph as
.npy files that `partition --builder distributed` memory-maps and reads in part.
"""

import argparse
import csv
import importlib.util
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from dglkit import chunkprep, graphfile, hetero, kinds
from dglkit.common import UserError, digest, emit_result, peak_rss_mb, read_csv, read_json, write_json
from dglkit.progress import PROGRESS
from dglkit.resources import MEMORY_HELP, check_fits, memory_estimate
from dglkit.settings import SETTINGS

# Bump when the same inputs would give a different graph, so that old outputs are rebuilt.
FORMAT = 2
MASKS = ("train_mask", "val_mask", "test_mask")
# Class centres are scaled so that features alone separate classes only weakly: a model has to
# aggregate neighbours (the graph is homophilous) to do well.
FEATURE_SIGNAL = 1.5
# The synthetic graph's options (their dest) and the job settings whose defaults they take, so that `prepare` and
# `chunked generate` run by hand make the graph train.yml makes with the default settings.
SYNTHETIC_SETTINGS = {"num_nodes": "synthetic_nodes", "avg_degree": "synthetic_degree",
                      "num_classes": "synthetic_classes", "feat_dim": "synthetic_feat_dim", "seed": "synthetic_seed"}


def setting_default(dest: str) -> Any:
    """The default of a synthetic graph's option: its job setting's."""
    return SETTINGS[SYNTHETIC_SETTINGS[dest]].default


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", required=True,
                        help="'synthetic', 'synthetic-hetero', 'files', 'chunked' (a graph in DGL's chunked format "
                             "at --path: only dataset.json is written), or an OGB node-property dataset such as "
                             "ogbn-products or ogbn-mag")
    parser.add_argument("--out", required=True, type=Path, help="output directory (graph.dgl, dataset.json)")
    parser.add_argument("--seed", type=int, default=setting_default("seed"),
                        help="seed of the generator and of fraction splits (%(default)s)")
    add_synthetic_arguments(parser)
    ogb = parser.add_argument_group("ogbn-*")
    ogb.add_argument("--data-root", type=Path,
                     help="directory holding ogbn_<name>/ (or the official zip's <name>/ directory)")
    ogb.add_argument("--allow-download", action="store_true",
                     help="download the dataset from OGB when it is not under --data-root")
    files = parser.add_argument_group("files")
    files.add_argument("--path", type=Path,
                       help="an .npz, or a directory of .npy files (edges and labels may be .csv): edges "
                            "(E x 2 or 2 x E), feat (N x F), labels (N), optional train_mask/val_mask/test_mask; "
                            "chunked: the directory holding metadata.json")
    parser.add_argument("--add-reverse-edges", action="store_true",
                        help="files and ogbn-*: make the graph symmetric (the synthetic graph always is)")
    parser.add_argument("--memory-gb", type=float, help=MEMORY_HELP)
    parser.add_argument("--whole", action="store_true",
                        help="chunked: read the graph whole into DIR/graph.dgl, for the single-host builders "
                             "(lean, dgl, distributed), when it fits this host")
    parser.add_argument("--arrays", action="store_true",
                        help="also write the structure, node data and edge data as .npy files in DIR/arrays/, which "
                             "`partition --builder distributed` reads in part on each host (homogeneous graphs)")
    links = parser.add_argument_group("link prediction: edges held out of the graph (homogeneous graphs)")
    links.add_argument("--val-edges-frac", type=float, default=0.0,
                       help="fraction of node pairs removed from the graph and kept for validation (%(default)s)")
    links.add_argument("--test-edges-frac", type=float, default=0.0,
                       help="fraction of node pairs removed from the graph and kept for testing (%(default)s)")


def add_synthetic_arguments(parser: argparse.ArgumentParser) -> None:
    """The synthetic graphs' parameters and the split fractions (`dglkit chunked generate` takes them too)."""
    split = parser.add_argument_group("split fractions (synthetic, and files without masks)")
    split.add_argument("--train-frac", type=float, default=0.1, help="fraction of nodes to train on (%(default)s)")
    split.add_argument("--val-frac", type=float, default=0.05, help="fraction validated every epoch (%(default)s)")
    split.add_argument("--test-frac", type=float, default=0.1, help="fraction tested at the end (%(default)s)")
    syn = parser.add_argument_group("synthetic: degree-corrected stochastic block model")
    syn.add_argument("--num-nodes", type=int, default=setting_default("num_nodes"),
                     help="number of nodes (%(default)s)")
    # A float as the role's --avg-degree 10 parses: the same fingerprint.
    syn.add_argument("--avg-degree", type=float, default=float(setting_default("avg_degree")),
                     help="mean in-degree of the symmetric graph, before dropping self loops and duplicates (%(default)g)")
    syn.add_argument("--num-classes", type=int, default=setting_default("num_classes"),
                     help="number of label classes (%(default)s)")
    syn.add_argument("--feat-dim", type=int, default=setting_default("feat_dim"),
                     help="node feature dimension (%(default)s)")
    syn.add_argument("--num-communities", type=int, default=0,
                     help="communities (class = community %% num-classes); 0: max(num-classes, nodes/1000)")
    syn.add_argument("--homophily", type=float, default=0.8, help="fraction of edges inside a community (%(default)s)")
    syn.add_argument("--label-noise", type=float, default=0.1,
                     help="fraction of nodes whose label is redrawn at random (caps the reachable accuracy; %(default)s)")


def run(args: argparse.Namespace) -> int:
    if args.dataset == kinds.CHUNKED.name:
        return chunkprep.run(args)
    if args.whole:
        raise UserError(f"--whole reads a graph in DGL's chunked format whole (--dataset chunked); {args.dataset} is "
                        "built whole already")
    source, params, inputs = check_arguments(args)
    if args.val_edges_frac or args.test_edges_frac:  # only then: fingerprints of other datasets stay as they were
        params["edges"] = {"val": args.val_edges_frac, "test": args.test_edges_frac, "seed": args.seed}
    fingerprint = digest({"format": FORMAT, "source": source, "params": params, "inputs": inputs})
    out: Path = args.out
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; give a directory")
    meta_path = out / "dataset.json"
    old = read_json(meta_path)
    if (old and old.get("fingerprint") == fingerprint and graphfile.is_current(out, old)
            and (old.get("arrays") or not args.arrays)):
        emit_result({"changed": False, "out": str(out), **summary(old)})
        return 0

    estimate = prepare_estimate(source, params, inputs)
    if estimate:
        what, need_memory, need_disk = estimate
        check_fits(what, need_memory, need_disk * (2 if args.arrays else 1), out,
                   args.memory_gb, ways_out="prepare on a storage host with more memory (the inventory's storage "
                   "group), or prepare the dataset elsewhere and give it as --dataset files")
    start = time.perf_counter()
    arrays = source_arrays(args, source, params, inputs)
    category = arrays.get("category")
    if category and args.arrays:
        raise UserError("--arrays (for `partition --builder distributed`) works on homogeneous graphs only")
    PROGRESS.phase("build the graph")
    graph = hetero.make_graph(arrays) if category else make_graph(
        arrays, reverse=source != "synthetic" and args.add_reverse_edges)
    del arrays
    if category and params.get("edges"):
        raise UserError("--val-edges-frac/--test-edges-frac (link prediction) work on homogeneous graphs only")
    held_out = hold_out_edges(graph, params["edges"], np.random.default_rng(args.seed)) if params.get("edges") else None

    out.mkdir(parents=True, exist_ok=True)
    if held_out:
        graph = held_out.pop("graph")
        np.savez(out / "edge_split.npz", **held_out)
    saved = graphfile.save(graph, out, args.arrays)
    meta = {
        "source": args.dataset, "parameters": params, "inputs": inputs, "fingerprint": fingerprint,
        **(hetero.describe(graph, category) if category else {
            "heterogeneous": False, "num_nodes": graph.num_nodes(), "num_edges": graph.num_edges(),
            "num_classes": int(graph.ndata["labels"].max()) + 1, "feat_dim": int(graph.ndata["feat"].shape[1]),
            **{f"num_{name[:-5]}": int(graph.ndata[name].sum()) for name in MASKS}}),
        **({"held_out_edges": {"file": "edge_split.npz", "val": len(held_out["val_src"]),
                               "test": len(held_out["test_src"]), "reverse_edges": "second half"}}
           if held_out else {}),
        **saved,
        "seconds": round(time.perf_counter() - start, 2), "peak_rss_mb": round(peak_rss_mb()),
    }
    write_json(meta_path, meta)
    emit_result({"changed": True, "out": str(out), **summary(meta)})
    return 0


def source_arrays(args: argparse.Namespace, source: str, params: dict[str, Any],
                  inputs: dict[str, Any]) -> dict[str, Any]:
    """The graph's arrays by name, with split masks; a heterogeneous graph's also name its category and hold
    dicts per type."""
    PROGRESS.phase({"files": "read the files", "ogb": "load the OGB dataset (download, convert)"}.get(
        source, f"generate the {source} graph"))
    if source == "synthetic":
        arrays: dict[str, Any] = synthetic(np.random.default_rng(args.seed), **params["graph"])
    elif source == "synthetic-hetero":
        arrays = hetero.synthetic_hetero(np.random.default_rng(args.seed), **params["graph"])
    elif source == "files":
        path = args.path
        arrays = hetero.load_files(path) if hetero.is_files_dir(path) else check_arrays(load_files(path), str(path))
    else:
        arrays = load_ogb(args.dataset, inputs["dir"], inputs["release"])
    if "train_mask" not in arrays:
        arrays.update(split_masks(arrays["labels"], params["split"], np.random.default_rng(args.seed)))
    return arrays


def prepare_estimate(source: str, params: dict[str, Any], inputs: dict[str, Any]) -> tuple[str, int, int] | None:
    """(what, peak memory bytes, graph file bytes) before anything is read, or None for OGB datasets (their
    sizes are known only once ogb has read them)."""
    if source == "synthetic":
        graph = params["graph"]
        nodes, edges, feat_dim = graph["num_nodes"], round(graph["num_nodes"] * graph["avg_degree"]), graph["feat_dim"]
        file_bytes = graphfile.file_bytes(nodes, edges, feat_dim)
        return (f"preparing {nodes} nodes and about {edges} edges", memory_estimate("prepare", nodes, edges, feat_dim),
                file_bytes)
    if source == "files":
        file_bytes = sum(size for size, _ in inputs["files"].values())
        # Read once, converted to int64/float32 and built into a graph: about three copies at the peak.
        return (f"preparing {file_bytes / 2**30:.1f} GB of input files",
                int(memory_estimate("prepare", 0, 0, 0) + 3 * file_bytes), 2 * file_bytes)
    return None


def summary(meta: dict[str, Any]) -> dict[str, Any]:
    keys = ("fingerprint", "num_nodes", "num_edges", "num_classes", "seconds", "peak_rss_mb")
    return {key: meta.get(key) for key in keys}


def check_arguments(args: argparse.Namespace) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """Validate the arguments before anything is read or written: (source, parameters, input identity).
    The one exception: with --allow-download, a missing OGB dataset is downloaded here."""
    fracs = {"train": args.train_frac, "val": args.val_frac, "test": args.test_frac}
    if min(fracs.values()) < 0 or sum(fracs.values()) > 1 or fracs["train"] <= 0:
        raise UserError(f"split fractions {fracs} must be >= 0 with train > 0 and a sum <= 1")
    split = {**fracs, "seed": args.seed}
    edges = {"val": args.val_edges_frac, "test": args.test_edges_frac}
    if min(edges.values()) < 0 or sum(edges.values()) >= 1:
        raise UserError(f"--val-edges-frac and --test-edges-frac {edges} must be >= 0 with a sum < 1")
    kind = kinds.kind(args.dataset)
    if kind is None:
        raise UserError(f"--dataset {args.dataset!r}: use synthetic, synthetic-hetero, files or an ogbn-* name "
                        "(e.g. ogbn-products, ogbn-mag)")
    if kind == kinds.SYNTHETIC:
        if args.num_nodes < 2 or args.num_classes < 2 or args.feat_dim < 1:
            raise UserError("--num-nodes and --num-classes must be >= 2 and --feat-dim >= 1")
        if not 0 < args.avg_degree < args.num_nodes - 1:
            raise UserError(f"--avg-degree must be > 0 and < num-nodes - 1 = {args.num_nodes - 1}")
        if not (0 <= args.homophily <= 1 and 0 <= args.label_noise <= 1):
            raise UserError("--homophily and --label-noise are fractions between 0 and 1")
        if args.num_communities and not args.num_classes <= args.num_communities <= args.num_nodes:
            raise UserError("--num-communities must be 0 (automatic) or between --num-classes and --num-nodes")
        graph = {key: getattr(args, key) for key in (
            "num_nodes", "avg_degree", "num_classes", "feat_dim", "num_communities", "homophily", "label_noise")}
        return "synthetic", {"graph": graph, "split": split}, {}
    if kind == kinds.SYNTHETIC_HETERO:
        if args.num_nodes < 2 * args.num_classes or args.num_classes < 2 or args.feat_dim < 1:
            raise UserError("synthetic-hetero: --num-classes must be >= 2, --num-nodes (papers) >= 2 x classes "
                            "and --feat-dim >= 1")
        if not (0 <= args.homophily <= 1 and 0 <= args.label_noise <= 1):
            raise UserError("--homophily and --label-noise are fractions between 0 and 1")
        graph = {key: getattr(args, key) for key in ("num_nodes", "num_classes", "feat_dim", "homophily", "label_noise")}
        return "synthetic-hetero", {"graph": graph, "split": split}, {}
    if kind == kinds.FILES:
        if args.path is None or not args.path.exists():
            raise UserError(f"--dataset files needs --path to an .npz file or a directory; got {args.path}")
        files = [args.path] if args.path.is_file() else sorted(p for p in args.path.iterdir() if p.is_file())
        stats = {p.name: [p.stat().st_size, p.stat().st_mtime_ns] for p in files}
        if hetero.is_files_dir(args.path):
            files = sorted(p for p in args.path.rglob("*") if p.is_file())
            stats = {str(p.relative_to(args.path)): [p.stat().st_size, p.stat().st_mtime_ns] for p in files}
        params = {"split": split, "add_reverse_edges": args.add_reverse_edges}
        return "files", params, {"path": str(args.path.resolve()), "files": stats}
    meta = ogb_meta(args.dataset)
    return "ogb", {"add_reverse_edges": args.add_reverse_edges}, {
        "dir": str(find_ogb_dir(args.dataset, meta, args.data_root, args.allow_download)),
        "release": meta["version"]}


def synthetic(rng: np.random.Generator, num_nodes: int, avg_degree: float, num_classes: int, feat_dim: int,
              num_communities: int, homophily: float, label_noise: float) -> dict[str, np.ndarray]:
    """Degree-corrected stochastic block model: power-law degrees, contiguous communities (ids shuffled at
    the end), symmetric, without self loops or duplicate edges. Features are a class centre plus noise;
    labels are the community's class, redrawn at random for a `label_noise` fraction of nodes."""
    n = num_nodes
    k = num_communities or max(num_classes, n // 1000)
    # Pareto(2) weights: a few hubs, most nodes near the mean degree, like many real graphs.
    cum = np.cumsum(rng.pareto(2.0, n) + 1.0)
    cum0 = np.concatenate([[0.0], cum])
    starts = (np.arange(k + 1) * n + k - 1) // k  # community c owns nodes starts[c] <= i < starts[c + 1]
    m = round(n * avg_degree / 2)
    # Sorted draws make the binary searches walk memory in order (several times faster than random
    # probes); edge order does not matter, and then the in-community draws below stay local too.
    src = np.minimum(np.searchsorted(cum, np.sort(rng.random(m)) * cum[-1], side="right"), n - 1)
    dst = np.empty(m, np.int64)
    inside = rng.random(m) < homophily
    comm = src[inside] * k // n
    lo, hi = cum0[starts[comm]], cum0[starts[comm + 1]]
    dst[inside] = np.searchsorted(cum, lo + rng.random(len(comm)) * (hi - lo), side="right")
    del comm, lo, hi
    # Targets outside the community do not depend on the source: draw them sorted too, then shuffle.
    outside = np.flatnonzero(~inside)
    dst[outside] = rng.permutation(np.searchsorted(cum, np.sort(rng.random(len(outside))) * cum[-1], side="right"))
    del inside, outside
    np.minimum(dst, n - 1, out=dst)
    keep = src != dst
    pairs = np.unique(np.minimum(src, dst)[keep] * n + np.maximum(src, dst)[keep])
    del src, dst, keep
    a, b = np.divmod(pairs, n)
    del pairs
    # Shuffle ids so that neither DGL nor a reader can lean on communities being id ranges.
    perm = rng.permutation(n)
    a, b = perm[a], perm[b]
    klass = np.empty(n, np.int64)
    klass[perm] = (np.arange(n) * k // n) % num_classes
    labels = klass.copy()
    flip = rng.random(n) < label_noise
    labels[flip] = rng.integers(0, num_classes, int(flip.sum()))
    centres = rng.standard_normal((num_classes, feat_dim), dtype=np.float32) * np.float32(
        FEATURE_SIGNAL / np.sqrt(feat_dim))
    feat = rng.standard_normal((n, feat_dim), dtype=np.float32)
    for s in range(0, n, 1 << 18):  # in blocks: centres[klass] at once would double peak memory
        feat[s:s + (1 << 18)] += centres[klass[s:s + (1 << 18)]]
    return {"src": np.concatenate([a, b]), "dst": np.concatenate([b, a]), "feat": feat, "labels": labels}


def hold_out_edges(graph, fracs: dict[str, float], rng: np.random.Generator) -> dict:
    """Hold a random `fracs` share of node pairs out of the graph for validation and testing, so that message
    passing never sees them. Returns the remaining graph, symmetric without self loops, with edge i + E/2 the
    reverse of edge i (the trainer names both directions of a training edge for exclusion, which DGL 2.1's
    distributed sampler does not apply),
    and the held-out pairs in original node IDs: val_src, val_dst, test_src, test_dst."""
    import dgl
    import torch

    n = graph.num_nodes()
    src, dst = (ids.numpy() for ids in graph.edges())
    keep = src != dst
    pairs = np.unique(np.minimum(src, dst)[keep] * n + np.maximum(src, dst)[keep])
    order = rng.permutation(len(pairs))
    which = np.zeros(len(pairs), np.int8)
    num_val, num_test = round(fracs["val"] * len(pairs)), round(fracs["test"] * len(pairs))
    which[order[:num_val]], which[order[num_val:num_val + num_test]] = 1, 2
    if (fracs["val"] and not num_val) or (fracs["test"] and not num_test):
        raise UserError(f"the graph's {len(pairs)} node pairs are too few to hold out {fracs} of them")
    a, b = (torch.from_numpy(ids) for ids in np.divmod(pairs[which == 0], n))
    held = {"graph": dgl.graph((torch.cat([a, b]), torch.cat([b, a])), num_nodes=n, idtype=torch.int64)}
    held["graph"].ndata.update(graph.ndata)
    for code, name in ((1, "val"), (2, "test")):
        held[f"{name}_src"], held[f"{name}_dst"] = np.divmod(pairs[which == code], n)
    return held


def split_masks(labels: np.ndarray, split: dict[str, float], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Disjoint random train/val/test masks with the given fractions of all nodes."""
    n = len(labels)
    order = rng.permutation(n)
    masks, begin, total = {}, 0, 0.0
    for name in ("train", "val", "test"):
        total += split[name]
        end = round(total * n)  # cumulative, so that fractions summing to 1 cover every node
        masks[f"{name}_mask"] = np.zeros(n, bool)
        masks[f"{name}_mask"][order[begin:end]] = True
        begin = end
    if not masks["train_mask"].any():
        raise UserError(f"--train-frac {split['train']} of {n} nodes selects no training node")
    return masks


def load_files(path: Path) -> dict[str, np.ndarray]:
    """Arrays by name from an .npz or a directory of .npy (edges/labels also .csv) files."""
    if path.is_file():
        try:
            with np.load(path, allow_pickle=False) as npz:
                return {name: npz[name] for name in npz.files}
        except (OSError, ValueError) as error:
            raise UserError(f"{path}: not a readable .npz file ({error})") from None
    arrays = {}
    for name in ("edges", "feat", "labels", *MASKS):
        if (path / f"{name}.npy").is_file():
            try:
                arrays[name] = np.load(path / f"{name}.npy", allow_pickle=False)
            except (OSError, ValueError) as error:
                raise UserError(f"{path / name}.npy: not a readable .npy file ({error})") from None
        elif name in ("edges", "labels") and (path / f"{name}.csv").is_file():
            arrays[name] = read_csv(path / f"{name}.csv")
    return arrays


def check_arrays(arrays: dict[str, np.ndarray], where: str) -> dict[str, np.ndarray]:
    """Validate the user's arrays and return them as src, dst, feat, labels (+ masks when given)."""
    missing = [name for name in ("edges", "feat", "labels") if name not in arrays]
    if missing:
        raise UserError(f"{where}: missing {', '.join(missing)} (expected edges, feat, labels "
                        f"[+ train_mask, val_mask, test_mask] as .npz keys or .npy files)")
    edges, feat, labels = arrays["edges"], arrays["feat"], arrays["labels"]
    if edges.ndim != 2 or 2 not in edges.shape or not np.issubdtype(edges.dtype, np.integer):
        raise UserError(f"{where}: edges must be an integer E x 2 or 2 x E array, got {edges.dtype} {edges.shape}")
    if edges.shape[1] != 2:
        edges = edges.T
    if feat.ndim != 2 or not (np.issubdtype(feat.dtype, np.floating) or np.issubdtype(feat.dtype, np.integer)):
        raise UserError(f"{where}: feat must be a numeric N x F array, got {feat.dtype} {feat.shape}")
    feat = feat.astype(np.float32, copy=False)
    if not np.isfinite(feat).all():
        raise UserError(f"{where}: feat contains NaN or infinite values")
    n = len(feat)
    if len(edges) and (edges.min() < 0 or edges.max() >= n):
        raise UserError(f"{where}: edge node ids must be in [0, {n}) (N = rows of feat); "
                        f"found ids {edges.min()}..{edges.max()}")
    if labels.ndim == 2 and labels.shape[1] == 1:
        labels = labels[:, 0]
    if labels.shape != (n,) or not np.issubdtype(labels.dtype, np.integer):
        raise UserError(f"{where}: labels must be {n} integers (one per feat row), got {labels.dtype} {labels.shape}")
    if n and labels.min() < 0:
        raise UserError(f"{where}: labels must be class ids >= 0, found {labels.min()}")
    if len(np.unique(labels)) < 2:
        raise UserError(f"{where}: labels hold fewer than 2 distinct classes")
    result = {"src": edges[:, 0].astype(np.int64), "dst": edges[:, 1].astype(np.int64),
              "feat": feat, "labels": labels.astype(np.int64)}
    given = [name for name in MASKS if name in arrays]
    if given and len(given) < 3:
        raise UserError(f"{where}: has {', '.join(given)} but not all of {', '.join(MASKS)}; give all three "
                        "or none (then --train-frac/--val-frac/--test-frac split the nodes)")
    for name in given:
        mask = arrays[name]
        if mask.shape != (n,) or not (mask.dtype == bool or np.isin(mask, (0, 1)).all()):
            raise UserError(f"{where}: {name} must be {n} booleans (or 0/1), got {mask.dtype} {mask.shape}")
        result[name] = mask.astype(bool)
    if given:
        if not result["train_mask"].any():
            raise UserError(f"{where}: train_mask selects no node")
        if (result["train_mask"].astype(int) + result["val_mask"] + result["test_mask"]).max() > 1:
            raise UserError(f"{where}: train_mask, val_mask and test_mask overlap; a node may be in one only")
    return result


def ogb_meta(name: str) -> dict[str, Any]:
    """OGB's own description of a dataset (ogb/nodeproppred/master.csv), if we can train on it."""
    spec = importlib.util.find_spec("ogb")  # without importing ogb, which pulls in torch and scikit-learn
    if spec is None or spec.origin is None:
        raise UserError("ogb is not installed: pip install --no-deps -r app/requirements/ogb.txt")
    with open(Path(spec.origin).parent / "nodeproppred" / "master.csv", newline="") as f:
        header, *rows = csv.reader(f)
    columns = {row[0]: row[1:] for row in rows}
    if name not in header:
        raise UserError(f"unknown OGB dataset {name!r}; node-property datasets: {', '.join(header[1:])}")
    meta = {key: values[header.index(name) - 1] for key, values in columns.items()}
    if meta["task type"] != "multiclass classification":
        raise UserError(f"{name} is not a multiclass dataset; node classification here supports e.g. "
                        "ogbn-products, ogbn-arxiv, ogbn-mag")
    return meta


def find_ogb_dir(name: str, meta: dict[str, Any], root: Path | None, allow_download: bool) -> Path:
    """The dataset directory under root: ogb's own name (ogbn_products) or the official zip's (products)."""
    if root is None:
        raise UserError(f"--dataset {name} needs --data-root (the directory holding its files)")
    release = f"RELEASE_v{meta['version']}.txt"
    names = ["_".join(name.split("-")), meta["download_name"]]
    found = [root / d for d in names if (root / d).is_dir()]
    if not found and allow_download:
        from ogb.utils.url import download_url, extract_zip

        root.mkdir(parents=True, exist_ok=True)
        archive = download_url(meta["url"], str(root))
        extract_zip(archive, str(root))
        os.unlink(archive)
        found = [root / meta["download_name"]]
    if not found:
        raise UserError(f"{name} not found: expected {root / names[0]}/{release} with raw/*.csv.gz and "
                        f"split/{meta['split']}/*.csv.gz (or the official zip unpacked as {root / names[1]}/), "
                        "or pass --allow-download")
    directory = found[0]
    if not (directory / release).is_file():
        raise UserError(f"{directory / release} is missing: ogb would ask whether to re-download; if the files "
                        f"are OGB's release {meta['version']}, create that empty file")
    raw = ("data.npz" if meta["binary"] == "True" else
           "triplet-type-list.csv.gz" if meta["is hetero"] == "True" else "edge.csv.gz")
    if not ((directory / "processed" / "dgl_data_processed").is_file() or (directory / "raw" / raw).is_file()):
        raise UserError(f"{directory}: neither raw/{raw} nor processed/dgl_data_processed is there")
    split = directory / "split" / meta["split"]
    # Heterogeneous datasets split per node type: split/<split>/<type>/train.csv.gz.
    if not ((split / "train.csv.gz").is_file() or (split / "split_dict.pt").is_file()
            or any(split.glob("*/train.csv.gz"))):
        raise UserError(f"{split}: train.csv.gz, valid.csv.gz and test.csv.gz are missing")
    return directory


def load_ogb(name: str, directory: str, release: str) -> dict[str, np.ndarray]:
    """The graph, flattened labels and the official split as masks, as in DGL's distributed tutorial."""
    from ogb.nodeproppred import DglNodePropPredDataset

    meta = {**ogb_meta(name), "dir_path": directory}
    stdin, sys.stdin = sys.stdin, open(os.devnull)  # any question ogb asks fails instead of blocking
    try:
        dataset = DglNodePropPredDataset(name, meta_dict=meta)
        split = dataset.get_idx_split()
    except EOFError:
        raise UserError(f"ogb asked a question about {directory} (release {release}); "
                        "check the files against OGB's layout") from None
    finally:
        sys.stdin.close()
        sys.stdin = stdin
    if meta["is hetero"] == "True":
        return hetero.load_ogb(dataset, split)
    graph, labels = dataset[0]
    n = graph.num_nodes()
    src, dst = graph.edges()
    masks = {}
    for name, key in zip(MASKS, ("train", "valid", "test")):
        masks[name] = np.zeros(n, bool)
        masks[name][split[key].numpy()] = True
    # papers100M leaves unlabelled nodes NaN; they are in no split, -1 keeps labels integral.
    labels = np.nan_to_num(labels[:, 0].numpy(), nan=-1).astype(np.int64)
    return {"src": src.numpy(), "dst": dst.numpy(), "feat": graph.ndata["feat"].numpy(), "labels": labels,
            **masks}


def make_graph(arrays: dict[str, np.ndarray], reverse: bool):
    import dgl
    import torch

    n = len(arrays["feat"])
    graph = dgl.graph((torch.from_numpy(arrays["src"]), torch.from_numpy(arrays["dst"])), num_nodes=n,
                      idtype=torch.int64)
    if reverse:
        graph = dgl.to_bidirected(graph)
    graph.ndata["feat"] = torch.from_numpy(arrays["feat"].astype(np.float32, copy=False))
    graph.ndata["labels"] = torch.from_numpy(arrays["labels"])
    for name in MASKS:
        graph.ndata[name] = torch.from_numpy(arrays[name])
    return graph
