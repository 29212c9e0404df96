"""Heterogeneous graphs: several node and edge types, labels on one node type (the category).

Sources (`dglkit prepare`): `synthetic-hetero` (a seeded academic graph shaped like ogbn-mag), `ogbn-mag`
through ogb from pre-placed files, and `files` when the directory holds num_nodes.json (format below). Every
relation (src, rel, dst) also gets its reverse (dst, rev_rel, src), so that every node type receives messages.

The user's files (a directory):
  num_nodes.json                             {"paper": 1000, "author": 800, ...}: one count per node type
  nodes/<type>/feat.npy                      optional: float N_type x F (featureless types learn embeddings)
  nodes/<type>/labels.npy                    on exactly one type (the category): N_type class ids >= 0
  nodes/<type>/{train,val,test}_mask.npy     optional, on the category, all three or none (then fractions)
  edges/<src>___<relation>___<dst>.npy       E x 2 (or 2 x E) node ids per type; .csv also read

`dglkit partition` partitions with METIS, balancing the category's training nodes, and saves the original
per-type IDs (orig_nids.npz: one array per node type, orig_eids.npz: one per relation 'src:rel:dst').
"""

import json
from pathlib import Path
from typing import Any

import numpy as np

from dglkit.common import UserError, read_csv

MASKS = ("train_mask", "val_mask", "test_mask")


def is_files_dir(path: Path) -> bool:
    return path.is_dir() and (path / "num_nodes.json").is_file()


def synthetic_hetero(rng: np.random.Generator, num_nodes: int, num_classes: int, feat_dim: int,
                     homophily: float, label_noise: float) -> dict[str, Any]:
    """Papers (with features and labels), authors, institutions and fields of study, related as in ogbn-mag.

    Each node has a hidden class. Institutions and fields get theirs round robin; an author mostly shares
    the class of its institution, a paper mostly the class of its authors, fields and cited papers
    (`homophily` is the share of same-class choices). Paper features carry the class only weakly and
    authors, institutions and fields have none, so a model has to learn from the relations."""
    papers, authors = num_nodes, max(num_nodes // 2, num_classes)
    institutions, fields = max(num_nodes // 200, num_classes), max(num_nodes // 100, num_classes)
    inst_class, field_class = np.arange(institutions) % num_classes, np.arange(fields) % num_classes
    paper_class = rng.integers(0, num_classes, papers)

    def pick(classes: np.ndarray, of: np.ndarray) -> np.ndarray:
        """For each wanted class in `classes`: a random node of `of` with that class, or (1 - homophily) any node."""
        by_class = [np.flatnonzero(of == c) for c in range(num_classes)]
        chosen = rng.integers(0, len(of), len(classes))
        same = rng.random(len(classes)) < homophily
        for c in range(num_classes):
            rows = np.flatnonzero(same & (classes == c))
            chosen[rows] = by_class[c][rng.integers(0, len(by_class[c]), len(rows))]
        return chosen

    affiliation = rng.integers(0, institutions, authors)
    author_class = np.where(rng.random(authors) < homophily, inst_class[affiliation],
                            rng.integers(0, num_classes, authors))
    author_class[: num_classes] = np.arange(num_classes)  # every class has an author to pick
    # Power-law activity: a few prolific papers and authors, most with one to a handful of edges.
    writes_per_paper = np.minimum(rng.zipf(2.5, papers), 8)
    topics_per_paper = np.minimum(rng.zipf(2.5, papers), 5)
    cites_per_paper = np.minimum(rng.zipf(2.0, papers), 30)
    wrote = np.repeat(np.arange(papers), writes_per_paper)
    topic = np.repeat(np.arange(papers), topics_per_paper)
    citing = np.repeat(np.arange(papers), cites_per_paper)
    cited = pick(paper_class[citing], paper_class)
    keep = citing != cited
    edges = {
        ("author", "affiliated_with", "institution"): (np.arange(authors), affiliation),
        ("author", "writes", "paper"): (pick(paper_class[wrote], author_class), wrote),
        ("paper", "has_topic", "field_of_study"): (topic, pick(paper_class[topic], field_class)),
        ("paper", "cites", "paper"): (citing[keep], cited[keep]),
    }
    labels = paper_class.copy()
    flip = rng.random(papers) < label_noise
    labels[flip] = rng.integers(0, num_classes, int(flip.sum()))
    centres = rng.standard_normal((num_classes, feat_dim), dtype=np.float32) * np.float32(1.0 / np.sqrt(feat_dim))
    feat = rng.standard_normal((papers, feat_dim), dtype=np.float32) + centres[paper_class]
    return {"category": "paper", "num_nodes": {"paper": papers, "author": authors, "institution": institutions,
                                               "field_of_study": fields},
            "edges": edges, "feat": {"paper": feat}, "labels": labels}


def load_files(path: Path) -> dict[str, Any]:
    """The user's heterogeneous graph (layout in the module docstring), checked."""
    try:
        num_nodes = json.loads((path / "num_nodes.json").read_text())
        num_nodes = {str(ntype): int(count) for ntype, count in num_nodes.items()}
    except (ValueError, TypeError, AttributeError) as error:
        raise UserError(f"{path}/num_nodes.json must map node types to counts, like {{\"paper\": 1000}} ({error})") from None
    if not num_nodes or min(num_nodes.values()) < 1:
        raise UserError(f"{path}/num_nodes.json: give at least one node type, each with at least 1 node")

    def array(file: Path) -> np.ndarray:
        try:
            return np.load(file, allow_pickle=False) if file.suffix == ".npy" else read_csv(file)
        except (OSError, ValueError) as error:
            raise UserError(f"{file}: not readable ({error})") from None

    unknown = sorted(d.name for d in (path / "nodes").glob("*") if d.name not in num_nodes)
    if unknown:
        raise UserError(f"{path}/nodes/ has types {unknown} that num_nodes.json does not list")
    feat, labelled = {}, [t for t in num_nodes if (path / "nodes" / t / "labels.npy").is_file()]
    if len(labelled) != 1:
        raise UserError(f"{path}: exactly one node type needs nodes/<type>/labels.npy (the category to classify); "
                        f"found {labelled or 'none'}")
    for ntype, count in num_nodes.items():
        if (path / "nodes" / ntype / "feat.npy").is_file():
            feat[ntype] = array(path / "nodes" / ntype / "feat.npy")
            if feat[ntype].ndim != 2 or len(feat[ntype]) != count or not np.isfinite(feat[ntype]).all():
                raise UserError(f"{path}/nodes/{ntype}/feat.npy must be {count} x F finite numbers, "
                                f"got {feat[ntype].dtype} {feat[ntype].shape}")
            feat[ntype] = feat[ntype].astype(np.float32, copy=False)
    category = labelled[0]
    graph = {"category": category, "num_nodes": num_nodes, "feat": feat,
             "labels": array(path / "nodes" / category / "labels.npy"), "edges": {}}
    for file in sorted((path / "edges").glob("*")):
        parts = file.stem.split("___")
        if file.suffix not in (".npy", ".csv") or len(parts) != 3 or parts[0] not in num_nodes or parts[2] not in num_nodes:
            raise UserError(f"{file}: edge files are named <src type>___<relation>___<dst type>.npy (or .csv) "
                            f"with types from num_nodes.json {sorted(num_nodes)}")
        edges = array(file)
        if edges.ndim != 2 or 2 not in edges.shape or not np.issubdtype(edges.dtype, np.integer):
            raise UserError(f"{file}: must be an integer E x 2 or 2 x E array, got {edges.dtype} {edges.shape}")
        edges = edges if edges.shape[1] == 2 else edges.T
        for column, ntype in ((0, parts[0]), (1, parts[2])):
            if len(edges) and (edges[:, column].min() < 0 or edges[:, column].max() >= num_nodes[ntype]):
                raise UserError(f"{file}: {ntype} ids must be in [0, {num_nodes[ntype]})")
        graph["edges"][tuple(parts)] = (edges[:, 0].astype(np.int64), edges[:, 1].astype(np.int64))
    if not graph["edges"]:
        raise UserError(f"{path}/edges/ holds no <src>___<relation>___<dst>.npy file")
    masks = [name for name in MASKS if (path / "nodes" / category / f"{name}.npy").is_file()]
    if masks:
        graph.update({name: array(path / "nodes" / category / f"{name}.npy") for name in masks})
    check_labels_and_masks(graph, str(path))
    return graph


def check_labels_and_masks(graph: dict[str, Any], where: str) -> None:
    n = graph["num_nodes"][graph["category"]]
    labels = graph["labels"]
    labels = labels[:, 0] if labels.ndim == 2 and labels.shape[1] == 1 else labels
    if labels.shape != (n,) or not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0:
        raise UserError(f"{where}: {graph['category']} labels must be {n} class ids >= 0, got {labels.dtype} {labels.shape}")
    graph["labels"] = labels.astype(np.int64)
    given = [name for name in MASKS if name in graph]
    if given and len(given) < 3:
        raise UserError(f"{where}: give all of {', '.join(MASKS)} for {graph['category']} or none")
    for name in given:
        if graph[name].shape != (n,):
            raise UserError(f"{where}: {name} must hold {n} booleans, got {graph[name].shape}")
        graph[name] = graph[name].astype(bool)


def load_ogb(dataset, split: dict) -> dict[str, Any]:
    """ogbn-mag as ogb's DglNodePropPredDataset gives it: labels, features and the official split on papers."""
    g, labels = dataset[0]
    category = next(iter(labels))
    n = g.num_nodes(category)
    graph = {"category": category, "num_nodes": {t: g.num_nodes(t) for t in g.ntypes},
             "edges": {etype: tuple(ids.numpy() for ids in g.edges(etype=etype)) for etype in g.canonical_etypes},
             "feat": {t: g.nodes[t].data["feat"].numpy() for t in g.ntypes if "feat" in g.nodes[t].data},
             "labels": labels[category][:, 0].numpy()}
    for name, key in zip(MASKS, ("train", "valid", "test")):
        graph[name] = np.zeros(n, bool)
        graph[name][split[key][category].numpy()] = True
    return graph


def make_graph(graph: dict[str, Any]):
    """The DGL heterograph, reverse relations added; features per type, labels and masks on the category."""
    import dgl
    import torch

    data = {}
    for (src, rel, dst), (u, v) in graph["edges"].items():
        data[src, rel, dst] = (torch.from_numpy(u), torch.from_numpy(v))
        data[dst, f"rev_{rel}", src] = (torch.from_numpy(v), torch.from_numpy(u))
    names = [rel for _, rel, _ in data]
    if len(set(names)) != len(names):
        raise UserError(f"relation names must be unique across types (RGCN keys its weights by them): {sorted(names)}")
    g = dgl.heterograph(data, num_nodes_dict=graph["num_nodes"], idtype=torch.int64)
    for ntype, feat in graph["feat"].items():
        g.nodes[ntype].data["feat"] = torch.from_numpy(feat)
    category = g.nodes[graph["category"]].data
    category["labels"] = torch.from_numpy(graph["labels"])
    for name in MASKS:
        category[name] = torch.from_numpy(graph[name])
    return g


def describe(g, category: str) -> dict[str, Any]:
    """dataset.json's fields for a heterogeneous graph."""
    data = g.nodes[category].data
    return {
        "heterogeneous": True, "category": category, "num_nodes": g.num_nodes(), "num_edges": g.num_edges(),
        "num_classes": int(data["labels"].max()) + 1, "feat_dim": int(data["feat"].shape[1]) if "feat" in data else 0,
        **{f"num_{name[:-5]}": int(data[name].sum()) for name in MASKS},
        "node_types": {t: {"num_nodes": g.num_nodes(t),
                           "feat_dim": int(g.nodes[t].data["feat"].shape[1]) if "feat" in g.nodes[t].data else 0}
                       for t in g.ntypes},
        "edge_types": {":".join(etype): g.num_edges(etype) for etype in g.canonical_etypes},
    }


def save_mappings(out: Path, orig_nids: dict, orig_eids: dict) -> None:
    """New per-type ID -> original per-type ID, one array per node type and per relation."""
    np.savez(out / "orig_nids.npz", **{ntype: ids.numpy() for ntype, ids in orig_nids.items()})
    np.savez(out / "orig_eids.npz", **{":".join(etype): ids.numpy() for etype, ids in orig_eids.items()})


def cut_and_counts(g, config: dict[str, Any], orig_nids: dict) -> dict[str, Any]:
    """Edge cut over all relations and, per part, owned nodes and edges and the category's training nodes."""
    num_parts = config["num_parts"]
    part_of, owned = {}, np.zeros(num_parts, np.int64)
    for ntype in g.ntypes:
        ranges = np.array(config["node_map"][ntype])
        sizes = ranges[:, 1] - ranges[:, 0]
        owned += sizes
        part_of[ntype] = np.empty(g.num_nodes(ntype), np.int32)
        part_of[ntype][orig_nids[ntype].numpy()] = np.repeat(np.arange(num_parts, dtype=np.int32), sizes)
    cut = 0
    for src, rel, dst in g.canonical_etypes:
        u, v = (ids.numpy() for ids in g.edges(etype=(src, rel, dst)))
        cut += int(np.count_nonzero(part_of[src][u] != part_of[dst][v]))
    edges = sum((np.diff(np.array(ranges), axis=1)[:, 0] for ranges in config["edge_map"].values()),
                np.zeros(num_parts, np.int64))
    category = next(t for t in g.ntypes if "train_mask" in g.nodes[t].data)
    train = g.nodes[category].data["train_mask"].numpy().astype(bool)
    train_per_part = np.bincount(part_of[category][train], minlength=num_parts)
    parts = [{"part": i, "nodes": int(owned[i]), "edges": int(edges[i]), "train_nodes": int(train_per_part[i])}
             for i in range(num_parts)]
    return {"num_nodes": g.num_nodes(), "num_edges": g.num_edges(), "parts": parts,
            "edge_cut": {"count": cut, "fraction": round(cut / max(g.num_edges(), 1), 6)}}


