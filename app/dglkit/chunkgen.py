"""Synthetic graphs made chunk by chunk: chunk i of every type from (seed, i) alone, in memory the chunk's size.

The graphs are today's synthetic ones (dglkit.data.synthetic, dglkit.hetero.synthetic_hetero) recast so that
no step needs the whole graph: whatever the generator must know about an arbitrary node (its community, its
class, which nodes share them) follows from its ID in closed form.

- Node IDs are a seeded affine permutation of hidden positions (id = (a * position + b) mod n): communities are
  position ranges, scattered over the ID range and so over every node chunk, so that an ID-range split cuts
  most edges and a METIS-like partitioner finds the communities.
- Homogeneous (`synthetic`): a degree-corrected block model. A node's weight falls with its rank in its
  community as (rank + 1) ** -1/2, which gives Pareto(2)-like degrees as today's; a node starts
  Poisson(degree / 2 x weight / 2) pairs and picks each partner by weight (an inverse CDF in closed form), in its
  community with probability `homophily`, else in a community drawn at random. Pairs are symmetric (both
  directions written), without self loops, without duplicates within a chunk (a pair drawn from both of its
  ends in different chunks can repeat: a few per thousand). Edge chunk i holds the pairs started by the nodes
  at positions of chunk i; node chunk i the data of IDs of chunk i.
- Heterogeneous (`synthetic-hetero`): papers, authors, institutions and fields of study, related as in
  ogbn-mag; a node's class is its position modulo the class count, so "a random author of class c" is
  closed-form. Papers of chunk i start their writes, has_topic and cites edges, authors of chunk i their
  affiliations; every relation also gets its rev_ relation, as `dglkit prepare` adds.
"""

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from dglkit.common import UserError

FEATURE_SIGNAL = 1.5  # as dglkit.data's: features alone separate classes only weakly
MASKS = ("train_mask", "val_mask", "test_mask")
HOMOGENEOUS_NODE, HOMOGENEOUS_EDGE = "_N", "_N:_E:_N"  # DGL's names of a homogeneous graph's types
MAX_NODES = 2**31  # a * position stays below 2**62 in int64
# Streams of the per-chunk generators, so that edges and node data of one chunk draw independent numbers.
EDGES, NODES, CENTRES, PERMUTATION = 1, 2, 3, 4


@dataclass(frozen=True)
class Permutation:
    """id = (a * position + b) mod n, a coprime to n: a bijection computed for any slice of IDs alone."""
    n: int
    a: int
    b: int

    @staticmethod
    def seeded(n: int, seed: int, stream: int) -> "Permutation":
        rng = np.random.default_rng([seed, PERMUTATION, stream])
        a = int(rng.integers(n // 3, n))
        while math.gcd(a, n) != 1:
            a += 1
        return Permutation(n, a % n, int(rng.integers(0, n)))

    def ids(self, positions: np.ndarray) -> np.ndarray:
        return (self.a * positions + self.b) % self.n

    def positions(self, ids: np.ndarray) -> np.ndarray:
        inverse = pow(self.a, -1, self.n)
        return (inverse * ((ids - self.b) % self.n)) % self.n


def chunk_counts(total: int, num_chunks: int) -> list[int]:
    """DGL's split (tools/chunk_graph.py): the first total % num_chunks chunks get one more."""
    return [total // num_chunks + (i < total % num_chunks) for i in range(num_chunks)]


def chunk_range(total: int, num_chunks: int, chunk: int) -> np.ndarray:
    counts = chunk_counts(total, num_chunks)
    start = sum(counts[:chunk])
    return np.arange(start, start + counts[chunk], dtype=np.int64)


def node_types(params: dict[str, Any]) -> dict[str, int]:
    """Node counts per type, in the order of homogeneous IDs."""
    n, classes = params["num_nodes"], params["num_classes"]
    if params["dataset"] == "synthetic":
        return {HOMOGENEOUS_NODE: n}
    return {"paper": n, "author": max(n // 2, classes), "institution": max(n // 200, classes),
            "field_of_study": max(n // 100, classes)}


HETERO_RELATIONS = ["author:affiliated_with:institution", "author:writes:paper", "paper:has_topic:field_of_study",
                    "paper:cites:paper"]


def edge_types(params: dict[str, Any]) -> list[str]:
    if params["dataset"] == "synthetic":
        return [HOMOGENEOUS_EDGE]
    return HETERO_RELATIONS + [reverse(etype) for etype in HETERO_RELATIONS]


def reverse(etype: str) -> str:
    src, rel, dst = etype.split(":")
    return f"{dst}:rev_{rel}:{src}"


def check_params(params: dict[str, Any]) -> None:
    n, classes, chunks = params["num_nodes"], params["num_classes"], params["num_chunks"]
    if not 2 <= n <= MAX_NODES or classes < 2 or params["feat_dim"] < 1 or params["avg_degree"] <= 0:
        raise UserError(f"--num-nodes must be in [2, {MAX_NODES}], --num-classes >= 2, --feat-dim >= 1 and "
                        "--avg-degree > 0")
    if params["dataset"] == "synthetic-hetero" and n < 2 * classes:
        raise UserError("synthetic-hetero: --num-nodes (papers) must be >= 2 x --num-classes")
    if not (0 <= params["homophily"] <= 1 and 0 <= params["label_noise"] <= 1):
        raise UserError("--homophily and --label-noise are fractions between 0 and 1")
    if params["num_communities"] and not classes <= params["num_communities"] <= n:
        raise UserError("--num-communities must be 0 (automatic) or between --num-classes and --num-nodes")
    if not 1 <= chunks <= n:
        raise UserError(f"--num-chunks must be between 1 and --num-nodes ({n})")
    split = params["split"]
    if min(split.values()) < 0 or sum(split.values()) > 1 or split["train"] <= 0:
        raise UserError(f"split fractions {split} must be >= 0 with train > 0 and a sum <= 1")


def generate(params: dict[str, Any], chunk: int) -> Iterator[tuple[str, str, str, Any]]:
    """Chunk `chunk`'s arrays one at a time, each dropped before the next is made: ("edges", etype, "", (src,
    dst)) or ("node", ntype, name, array)."""
    if params["dataset"] == "synthetic":
        yield "edges", HOMOGENEOUS_EDGE, "", homogeneous_edges(params, chunk)
        yield from labelled_nodes(params, HOMOGENEOUS_NODE, chunk, homogeneous_classes(params))
    else:
        yield from hetero_edges(params, chunk)
        yield from labelled_nodes(params, "paper", chunk, lambda ids: type_classes(params, "paper", ids))


def communities(params: dict[str, Any]) -> int:
    return params["num_communities"] or max(params["num_classes"], params["num_nodes"] // 1000)


def homogeneous_classes(params: dict[str, Any]):
    n, k = params["num_nodes"], communities(params)
    permutation = Permutation.seeded(n, params["seed"], 0)
    return lambda ids: (permutation.positions(ids) * k // n) % params["num_classes"]


def homogeneous_edges(params: dict[str, Any], chunk: int) -> tuple[np.ndarray, np.ndarray]:
    n, k = params["num_nodes"], communities(params)
    rng = np.random.default_rng([params["seed"], EDGES, chunk])
    positions = chunk_range(n, params["num_chunks"], chunk)
    community = positions * k // n
    start, size = community_start(community, n, k), community_size(community, n, k)
    weight = np.sqrt(size / (positions - start + 1))
    # Weights average about 2: a node starts degree / 2 x weight / 2 pairs on average, m = n x degree / 2 in all.
    src = np.repeat(positions, rng.poisson(params["avg_degree"] / 4 * weight))
    del positions, community, start, size, weight
    target = src * k // n
    outside = rng.random(len(src)) >= params["homophily"]
    target[outside] = rng.integers(0, k, int(outside.sum()))
    del outside
    size = community_size(target, n, k)
    # Density of rank x proportional to x ** -1/2 on (0, size]: x = size * U ** 2.
    dst = community_start(target, n, k) + np.minimum((size * rng.random(len(src)) ** 2).astype(np.int64), size - 1)
    del target, size
    keep = src != dst
    pairs = np.unique(np.minimum(src, dst)[keep] * n + np.maximum(src, dst)[keep])
    del src, dst, keep
    permutation = Permutation.seeded(n, params["seed"], 0)
    a, b = (permutation.ids(ends) for ends in np.divmod(pairs, n))
    return np.concatenate([a, b]), np.concatenate([b, a])


def community_start(community: np.ndarray, n: int, k: int) -> np.ndarray:
    """Community c owns positions start(c) <= p < start(c + 1), as p * k // n says (dglkit.data's layout)."""
    return (community * n + k - 1) // k


def community_size(community: np.ndarray, n: int, k: int) -> np.ndarray:
    return community_start(community + 1, n, k) - community_start(community, n, k)


def labelled_nodes(params: dict[str, Any], ntype: str, chunk: int, classes_of) -> Iterator[tuple[str, str, str, Any]]:
    """feat, labels (the class, redrawn for a label_noise share) and masks of the labelled type's chunk."""
    count, num_classes = node_types(params)[ntype], params["num_classes"]
    ids = chunk_range(count, params["num_chunks"], chunk)
    rng = np.random.default_rng([params["seed"], NODES, chunk])
    klass = classes_of(ids)
    scale = FEATURE_SIGNAL if params["dataset"] == "synthetic" else 1.0
    centres = np.random.default_rng([params["seed"], CENTRES]).standard_normal(
        (num_classes, params["feat_dim"]), dtype=np.float32) * np.float32(scale / np.sqrt(params["feat_dim"]))
    feat = rng.standard_normal((len(ids), params["feat_dim"]), dtype=np.float32)
    step = max(1, (1 << 24) // (4 * params["feat_dim"]))  # the centres added 16 MB of rows at a time: no second chunk-sized array
    for begin in range(0, len(ids), step):
        feat[begin:begin + step] += centres[klass[begin:begin + step]]
    yield "node", ntype, "feat", feat
    del feat
    labels = klass.astype(np.int64)
    flip = rng.random(len(ids)) < params["label_noise"]
    labels[flip] = rng.integers(0, num_classes, int(flip.sum()))
    yield "node", ntype, "labels", labels
    draw, bound = rng.random(len(ids)), 0.0
    for name, key in zip(MASKS, ("train", "val", "test")):
        # 0/1 uint8, as graph.dgl stores and loads masks.
        yield "node", ntype, name, ((draw >= bound) & (draw < bound + params["split"][key])).astype(np.uint8)
        bound += params["split"][key]


def type_classes(params: dict[str, Any], ntype: str, ids: np.ndarray) -> np.ndarray:
    count = node_types(params)[ntype]
    return Permutation.seeded(count, params["seed"], list(node_types(params)).index(ntype)).positions(ids) % \
        params["num_classes"]


def pick(params: dict[str, Any], ntype: str, classes: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """For each wanted class: a random node of `ntype` with that class, or (1 - homophily) any node."""
    count, num_classes = node_types(params)[ntype], params["num_classes"]
    # Positions c, c + K, c + 2K, ... have class c: (count - c + K - 1) // K of them.
    per_class = (count - classes + num_classes - 1) // num_classes
    positions = classes + num_classes * (rng.random(len(classes)) * per_class).astype(np.int64)
    anywhere = rng.random(len(classes)) >= params["homophily"]
    positions[anywhere] = rng.integers(0, count, int(anywhere.sum()))
    return Permutation.seeded(count, params["seed"], list(node_types(params)).index(ntype)).ids(positions)


# Papers start these relations: (relation, the other end's type, Zipf exponent of the count per paper, its cap).
PAPER_ACTIVITY = [("author:writes:paper", "author", 2.5, 8), ("paper:has_topic:field_of_study", "field_of_study", 2.5, 5),
                  ("paper:cites:paper", "paper", 2.0, 30)]


def hetero_edges(params: dict[str, Any], chunk: int) -> Iterator[tuple[str, str, str, Any]]:
    """Each relation's chunk and its reverse: authors of the chunk are affiliated, papers of the chunk write,
    have topics and cite, with ogbn-mag-like power-law activity."""
    rng = np.random.default_rng([params["seed"], EDGES, chunk])
    counts, num_chunks = node_types(params), params["num_chunks"]
    authors = chunk_range(counts["author"], num_chunks, chunk)
    institutions = pick(params, "institution", type_classes(params, "author", authors), rng)
    yield from both_ways("author:affiliated_with:institution", authors, institutions)
    del authors, institutions
    papers = chunk_range(counts["paper"], num_chunks, chunk)
    paper_class = type_classes(params, "paper", papers)
    for etype, other_type, exponent, most in PAPER_ACTIVITY:
        repeat = np.minimum(rng.zipf(exponent, len(papers)), most)
        own, other = np.repeat(papers, repeat), pick(params, other_type, np.repeat(paper_class, repeat), rng)
        if other_type == "author":
            yield from both_ways(etype, other, own)
        else:
            keep = own != other  # no paper cites itself
            yield from both_ways(etype, own[keep], other[keep])


def both_ways(etype: str, src: np.ndarray, dst: np.ndarray) -> Iterator[tuple[str, str, str, Any]]:
    yield "edges", etype, "", (src, dst)
    yield "edges", reverse(etype), "", (dst, src)
