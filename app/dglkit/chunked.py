"""DGL's chunked graph format (user guide 7.1, "Chunked Graph Format"): a graph no host has to hold whole.

A directory with metadata.json and data files, as DGL's tools/chunk_graph.py and GraphStorm's graph
construction write it:
  graph_name           the graph's name
  node_type            ["paper", "author", ...]; their order is the order of homogeneous node IDs
  num_nodes_per_chunk  one list per node type: nodes in each chunk (chunk i holds the type-local IDs that
                       follow chunk i - 1's)
  edge_type            ["author:writes:paper", ...] (canonical "src:rel:dst")
  num_edges_per_chunk  one list per edge type: edges in each chunk
  edges                {etype: {"format": {"name": "csv", "delimiter": " "}, "data": [one file per chunk]}},
                       each line "src dst" in type-local IDs of the src and dst types
  node_data            {ntype: {name: {"format": {"name": "numpy"}, "data": [one file per node chunk]}}}
  edge_data            {etype: {name: ...}} likewise, one file per edge chunk
Relative paths are relative to the directory. A homogeneous graph is one node type and one edge type (DGL
names them "_N" and "_N:_E:_N"). Formats read: csv and numpy; parquet needs pyarrow, which the node
environment does not have (the refusal says to convert it).

load() parses and checks metadata.json only; the readers read one chunk, hold that chunk only and check
it against the metadata (row counts, ID ranges, integer IDs, one dtype and row shape across a data's chunks),
so that check_chunks can split the checking across hosts. Every refusal is a UserError naming the file
and the fix.
"""

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from dglkit.common import UserError

METADATA = "metadata.json"
FORMATS = ("csv", "numpy")


class Format(NamedTuple):
    name: str  # csv or numpy
    delimiter: str = ","


@dataclass(frozen=True)
class ChunkedGraph:
    root: Path
    graph_name: str
    node_types: list[str]  # metadata order = homogeneous ID order
    num_nodes: dict[str, int]
    node_chunks: dict[str, list[int]]  # per type: nodes per chunk
    edge_types: list[str]  # canonical "src:rel:dst"
    num_edges: dict[str, int]
    edge_chunks: dict[str, list[int]]
    node_data: dict[str, dict[str, list[Path]]]  # ntype -> name -> one file per node chunk
    edge_data: dict[str, dict[str, list[Path]]]  # etype -> name -> one file per edge chunk
    edge_files: dict[str, list[Path]]  # etype -> one file per edge chunk
    formats: dict[Path, Format]  # every file listed, as metadata.json gives its format

    def node_offset(self, ntype: str) -> int:
        """The first homogeneous ID of the type: the types' nodes follow each other in metadata order."""
        index = self.node_types.index(ntype)
        return sum(self.num_nodes[t] for t in self.node_types[:index])

    @property
    def heterogeneous(self) -> bool:
        return len(self.node_types) > 1 or len(self.edge_types) > 1

    @property
    def num_chunks(self) -> int:
        """Chunk indices run below this; a type with fewer chunks has none at the higher indices."""
        return max(len(chunks) for chunks in [*self.node_chunks.values(), *self.edge_chunks.values()])

    def files(self) -> list[Path]:
        """Every data file metadata.json names, once each, in metadata order."""
        return list(self.formats)


def load(root: Path) -> ChunkedGraph:
    """The graph that root/metadata.json describes, its metadata checked (no data file is read)."""
    path = root / METADATA
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path} not found: a chunked graph directory holds DGL's metadata.json") from None
    except (OSError, ValueError) as error:
        raise UserError(f"{path} is not readable JSON ({error}): write it as DGL's chunked graph format") from None
    if not isinstance(meta, dict):
        raise UserError(f"{path} must hold a JSON object (graph_name, node_type, num_nodes_per_chunk, ...)")
    return Metadata(root, path, meta).graph()


class Metadata:
    """metadata.json's fields, checked one by one; every error names the file and the key."""

    def __init__(self, root: Path, path: Path, meta: dict[str, Any]) -> None:
        self.root, self.path, self.meta = root, path, meta
        self.formats: dict[Path, Format] = {}

    def fail(self, key: str, what: str) -> UserError:
        return UserError(f"{self.path}: {key} {what} (DGL's chunked graph format, docs/datasets.md)")

    def graph(self) -> ChunkedGraph:
        meta = self.meta
        name = meta.get("graph_name")
        if not isinstance(name, str) or not name:
            raise self.fail("graph_name", "must be a non-empty string")
        node_types = self.names("node_type", meta.get("node_type"))
        edge_types = self.names("edge_type", meta.get("edge_type"))
        for etype in edge_types:
            parts = etype.split(":")
            if len(parts) != 3 or not all(parts) or parts[0] not in node_types or parts[2] not in node_types:
                raise self.fail("edge_type", f"{etype!r} must be 'src:relation:dst' with src and dst from node_type "
                                f"{node_types}")
        node_chunks = self.counts("num_nodes_per_chunk", node_types)
        edge_chunks = self.counts("num_edges_per_chunk", edge_types)
        edges = self.mapping("edges", edge_types, required=True)
        edge_files = {etype: self.spec(f"edges[{etype!r}]", edges[etype], len(edge_chunks[etype]))
                      for etype in edge_types}
        return ChunkedGraph(
            root=self.root, graph_name=name, node_types=node_types,
            num_nodes={t: sum(c) for t, c in node_chunks.items()}, node_chunks=node_chunks,
            edge_types=edge_types, num_edges={t: sum(c) for t, c in edge_chunks.items()}, edge_chunks=edge_chunks,
            node_data=self.data("node_data", node_types, node_chunks),
            edge_data=self.data("edge_data", edge_types, edge_chunks),
            edge_files=edge_files, formats=self.formats)

    def names(self, key: str, value: Any) -> list[str]:
        if (not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value)
                or len(set(value)) != len(value)):
            raise self.fail(key, f"must be a non-empty list of distinct names, got {value!r}")
        return value

    def counts(self, key: str, types: list[str]) -> dict[str, list[int]]:
        value = self.meta.get(key)
        if not isinstance(value, list) or len(value) != len(types):
            raise self.fail(key, f"must hold one list of counts per type ({len(types)}: {types})")
        for counts in value:
            if (not isinstance(counts, list) or not counts
                    or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts)):
                raise self.fail(key, f"lists must hold counts >= 0, one per chunk; got {counts!r}")
        return dict(zip(types, value))

    def mapping(self, key: str, types: list[str], required: bool) -> dict[str, Any]:
        value = self.meta.get(key, None if required else {})
        if not isinstance(value, dict):
            raise self.fail(key, "must be an object keyed by type")
        unknown = sorted(set(value) - set(types))
        if unknown:
            raise self.fail(key, f"names types {unknown} that {'node_type' if key == 'node_data' else 'edge_type'} "
                            f"does not list ({types}): add them there or remove their entries")
        missing = [t for t in types if t not in value] if required else []
        if missing:
            raise self.fail(key, f"has no files for {missing}: every edge type needs its edge files")
        return value

    def data(self, key: str, types: list[str], chunks: dict[str, list[int]]) -> dict[str, dict[str, list[Path]]]:
        result: dict[str, dict[str, list[Path]]] = {}
        for kind, by_name in self.mapping(key, types, required=False).items():
            if not isinstance(by_name, dict):
                raise self.fail(f"{key}[{kind!r}]", "must be an object: data name -> {format, data}")
            result[kind] = {name: self.spec(f"{key}[{kind!r}][{name!r}]", spec, len(chunks[kind]))
                            for name, spec in by_name.items()}
        return result

    def spec(self, key: str, spec: Any, num_chunks: int) -> list[Path]:
        """A ChunkFileSpec's files, resolved against the directory; records their format."""
        fmt = spec.get("format") if isinstance(spec, dict) else None
        data = spec.get("data") if isinstance(spec, dict) else None
        if not isinstance(fmt, dict) or not isinstance(data, list) or not all(isinstance(p, str) and p for p in data):
            raise self.fail(key, 'must be {"format": {"name": ...}, "data": [file per chunk, ...]}')
        name = fmt.get("name")
        if name == "parquet":
            raise self.fail(key, "is parquet, which needs pyarrow (not in the node environment): write the "
                            "chunks as csv (edges) or numpy (data) instead")
        if name not in FORMATS:
            raise self.fail(key, f"format name {name!r} must be one of {', '.join(FORMATS)}")
        delimiter = fmt.get("delimiter", ",")
        if not isinstance(delimiter, str) or len(delimiter) != 1:
            raise self.fail(key, f"csv delimiter {delimiter!r} must be one character")
        if len(data) != num_chunks:
            raise self.fail(key, f"lists {len(data)} files but the type has {num_chunks} chunks: give one file per "
                            "chunk (rows of file i = the chunk's count)")
        files = [self.root / p for p in data]  # an absolute path stays as it is
        for file in files:
            self.formats.setdefault(file, Format(name, delimiter))
        return files


def read_edges(graph: ChunkedGraph, etype: str, chunk: int) -> tuple[np.ndarray, np.ndarray]:
    """Chunk `chunk` of an edge type: int64 type-local (src, dst), checked against the metadata."""
    path = graph.edge_files[etype][chunk]
    fmt = graph.formats[path]
    if fmt.name == "csv":
        frame = read_table(path, fmt.delimiter, np.int64, what="edge ids (type-local integers)")
        if frame.shape[1] != 2:
            raise UserError(f"{path}: {frame.shape[1]} columns; edge files hold two, 'src{fmt.delimiter}dst' per line")
        src, dst = (frame[:, i] for i in range(2))
    else:
        array = load_npy(path)
        if array.ndim != 2 or array.shape[1] != 2 or not np.issubdtype(array.dtype, np.integer):
            raise UserError(f"{path}: edge files hold integer E x 2 arrays, got {array.dtype} {array.shape}")
        src, dst = (np.asarray(array[:, i], dtype=np.int64) for i in range(2))
    expected = graph.edge_chunks[etype][chunk]
    if len(src) != expected:
        raise UserError(f"{path}: {len(src)} edges, but num_edges_per_chunk says {expected} for {etype} chunk "
                        f"{chunk}: correct metadata.json's count or the file")
    src_type, _, dst_type = etype.split(":")
    for ids, ntype, side in ((src, src_type, "source"), (dst, dst_type, "destination")):
        if len(ids) and (ids.min() < 0 or ids.max() >= graph.num_nodes[ntype]):
            bad = ids[(ids < 0) | (ids >= graph.num_nodes[ntype])][0]
            raise UserError(f"{path}: {side} id {bad} is outside {ntype}'s [0, {graph.num_nodes[ntype]}) (ids are "
                            f"type-local: 0 .. the type's node count - 1); fix the file or num_nodes_per_chunk")
    return src, dst


def read_node_data(graph: ChunkedGraph, ntype: str, name: str, chunk: int) -> np.ndarray:
    """Chunk `chunk` of a node data array (rows = the node chunk's count, dtype and row shape = chunk 0's)."""
    files = graph.node_data.get(ntype, {}).get(name)
    if files is None:
        raise UserError(f"{graph.root / METADATA}: node_data has no {name!r} for {ntype}")
    return read_data(graph, files, chunk, graph.node_chunks[ntype][chunk], f"{ntype} chunk {chunk} (node)")


def read_edge_data(graph: ChunkedGraph, etype: str, name: str, chunk: int) -> np.ndarray:
    files = graph.edge_data.get(etype, {}).get(name)
    if files is None:
        raise UserError(f"{graph.root / METADATA}: edge_data has no {name!r} for {etype}")
    return read_data(graph, files, chunk, graph.edge_chunks[etype][chunk], f"{etype} chunk {chunk} (edge)")


def read_data(graph: ChunkedGraph, files: list[Path], chunk: int, rows: int, what: str) -> np.ndarray:
    path = files[chunk]
    array = read_array(path, graph.formats[path])
    if len(array) != rows:
        raise UserError(f"{path}: {len(array)} rows, but {what} has {rows} in metadata.json: a data file holds "
                        "one row per node (edge) of its chunk")
    first = files[0]
    if chunk != 0:
        reference = data_header(first, graph.formats[first])
        if reference != (array.dtype, array.shape[1:]):
            raise UserError(f"{path}: {array.dtype} rows of shape {array.shape[1:]}, but {first.name} (chunk 0) has "
                            f"{reference[0]} {reference[1]}: write every chunk of a data array with one dtype "
                            "and row shape")
    return array


def data_header(path: Path, fmt: Format) -> tuple[np.dtype, tuple[int, ...]]:
    """A data file's dtype and row shape; of a .npy file from its header alone."""
    array = load_npy(path, mmap=True) if fmt.name == "numpy" else read_array(path, fmt)
    return array.dtype, array.shape[1:]


def read_array(path: Path, fmt: Format) -> np.ndarray:
    if fmt.name == "numpy":
        return load_npy(path)
    frame = read_table(path, fmt.delimiter, None, what="numbers")
    return frame[:, 0] if frame.shape[1] == 1 else frame


def load_npy(path: Path, mmap: bool = False) -> np.ndarray:
    try:
        return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except FileNotFoundError:
        raise UserError(f"{path} is missing (metadata.json lists it): write the chunk or correct the path") from None
    except (OSError, ValueError) as error:
        raise UserError(f"{path}: not a .npy file ({error}); metadata.json says numpy (np.save's format)") from None


def read_table(path: Path, delimiter: str, dtype: Any, what: str) -> np.ndarray:
    """A csv chunk through pandas' C parser, no header line, as one 2-D array."""
    import pandas as pd

    try:
        frame = pd.read_csv(path, sep=delimiter, header=None, dtype=dtype, engine="c")
    except FileNotFoundError:
        raise UserError(f"{path} is missing (metadata.json lists it): write the chunk or correct the path") from None
    except pd.errors.EmptyDataError:
        return np.empty((0, 2), dtype) if dtype is not None else np.empty((0, 1))
    except (ValueError, OverflowError, pd.errors.ParserError) as error:
        raise UserError(f"{path}: holds something other than {what}, {delimiter!r}-separated, no header line "
                        f"({str(error).splitlines()[0]})") from None
    if dtype is None and frame.dtypes.nunique() > 1:
        raise UserError(f"{path}: columns of different types {sorted(map(str, set(frame.dtypes)))}: give one type")
    return frame.to_numpy()


def check_chunks(graph: ChunkedGraph, chunks: Iterable[int]) -> None:
    """Read and check these chunk indices of every edge type, node data and edge data (a type with fewer chunks
    has none at the higher indices): W hosts check range(rank, graph.num_chunks, W) each, one chunk in memory."""
    for chunk in chunks:
        if not 0 <= chunk < graph.num_chunks:
            raise UserError(f"chunk {chunk} does not exist: {graph.root / METADATA} has chunks 0 .. "
                            f"{graph.num_chunks - 1}")
        for etype in graph.edge_types:
            if chunk >= len(graph.edge_chunks[etype]):
                continue
            read_edges(graph, etype, chunk)
            for name in graph.edge_data.get(etype, {}):
                read_edge_data(graph, etype, name, chunk)
        for ntype, names in graph.node_data.items():
            if chunk >= len(graph.node_chunks[ntype]):
                continue
            for name in names:
                read_node_data(graph, ntype, name, chunk)
