"""What the MPI programs of the distributed partitioner share (dglkit.mpiassign, dglkit.mpibuild): contiguous
ownership of node IDs, the bounded all-to-all exchange of rows, a rank's share of the edges, and a main that
stops every rank when one fails.

Run them under `mpirun -np W python -m dglkit.<program> ...`: rank r owns node IDs starts[r] .. starts[r+1] - 1
and reads edges E * r // W .. E * (r + 1) // W - 1 of the dataset's arrays/ (`dglkit prepare --arrays`) or,
of a graph in DGL's chunked format (`dglkit prepare --dataset chunked`), the chunks i with i mod W = r.
"""

import os
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dglkit import progress
from dglkit.common import UserError, read_json

# Edges read and sent per round: each round's buffers (about 64 bytes per edge) stay this size whatever the graph.
BATCH_EDGES = 1 << 22
# Bytes of node data rows read and sent per round (a chunk's rows go to their parts in rounds of this size).
BATCH_ROW_BYTES = 1 << 26
# Where each rank replaces its progress file (`dglkit mpi run` sets it; unset: no file).
PROGRESS_ENV = "DGLKIT_MPI_PROGRESS"


class Progress(progress.Progress):
    """This rank's progress file, $DGLKIT_MPI_PROGRESS/rank<r>.json (dglkit.progress's record with the rank and
    program). `dglkit mpi watch` shows them per host and names the rank that stopped first."""

    def start(self, rank: int, program: str) -> None:
        directory = os.environ.get(PROGRESS_ENV)
        self.open(Path(directory) / f"rank{rank}.json" if directory else None, {"rank": rank, "program": program})


PROGRESS = Progress()


def ranges(total: int, size: int) -> np.ndarray:
    """starts[r] .. starts[r + 1]: rank r's contiguous share of `total` items (sizes differ by at most one)."""
    return np.arange(size + 1, dtype=np.int64) * total // size


def owner(ids: np.ndarray, starts: np.ndarray) -> np.ndarray:
    return np.searchsorted(starts, ids, side="right") - 1


def exchange(comm: Any, rows: np.ndarray, dest: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Send each row of `rows` (int64 items, one row per item) to rank dest[i]. Return the rows this rank
    receives, grouped by sender in rank order and each sender's in its order, and how many came from each
    rank. Collective."""
    from mpi4py import MPI

    size = comm.Get_size()
    order = np.argsort(dest, kind="stable")
    send = np.ascontiguousarray(rows[order], dtype=np.int64)
    width = int(np.prod(rows.shape[1:], dtype=np.int64))
    send_counts = np.bincount(dest, minlength=size).astype(np.int64) * width
    recv_counts = np.empty(size, np.int64)
    comm.Alltoall(send_counts, recv_counts)
    received = np.empty((int(recv_counts.sum()) // width, *rows.shape[1:]), np.int64)
    displs = [np.concatenate([[0], np.cumsum(counts[:-1])]) for counts in (send_counts, recv_counts)]
    comm.Alltoallv([send, (send_counts, displs[0]), MPI.INT64_T], [received, (recv_counts, displs[1]), MPI.INT64_T])
    return received, recv_counts // width


def lookup(comm: Any, ids: np.ndarray, starts: np.ndarray, table: np.ndarray) -> np.ndarray:
    """table's rows (int64; row i holds node starts[rank] + i) of nodes `ids`, from the ranks that own them,
    one row per ID. Collective."""
    rank, size = comm.Get_rank(), comm.Get_size()
    unique, inverse = np.unique(ids, return_inverse=True)
    asked, per_rank = exchange(comm, unique[:, None], owner(unique, starts))
    answers, _ = exchange(comm, table[asked[:, 0] - starts[rank]], np.repeat(np.arange(size), per_rank))
    # Sorted IDs went out in owner order; the answers come back in the same order.
    return answers[inverse]


@dataclass(frozen=True)
class RowFormat:
    """A data array's dtype and row shape; its rows travel as int64 words of their bytes (zero-padded), which the
    exchange sends as it sends IDs."""
    dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def items(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def row_bytes(self) -> int:
        return self.dtype.itemsize * self.items

    @property
    def words(self) -> int:
        return -(-self.row_bytes // 8)

    def pack(self, rows: np.ndarray) -> np.ndarray:
        packed = np.zeros((len(rows), self.words), np.int64)
        flat = np.ascontiguousarray(rows, self.dtype).reshape(len(rows), self.items)
        packed.view(np.uint8)[:, :self.row_bytes] = flat.view(np.uint8)
        return packed

    def unpack(self, words: np.ndarray) -> np.ndarray:
        """The rows that pack() made these words of (a row's words may be a slice of a wider row)."""
        raw = np.ascontiguousarray(words).view(np.uint8)
        raw = raw if raw.shape[1] == self.row_bytes else np.ascontiguousarray(raw[:, :self.row_bytes])
        return raw.view(self.dtype).reshape(len(raw), *self.shape)


@dataclass(frozen=True)
class Types:
    """Node and edge types in the order of homogeneous IDs (metadata order), and where each type's IDs start:
    type t's nodes are homogeneous IDs node_starts[t] .. node_starts[t + 1] - 1, its edges likewise."""
    nodes: list[str]
    node_starts: np.ndarray
    edges: list[str]
    edge_starts: np.ndarray
    heterogeneous: bool

    @staticmethod
    def homogeneous(num_nodes: int, num_edges: int) -> "Types":
        """DGL's names of a homogeneous graph's one node type and one edge type."""
        return Types(["_N"], np.array([0, num_nodes], np.int64), ["_N:_E:_N"], np.array([0, num_edges], np.int64),
                     False)


class ArraysInput:
    """A prepared dataset's arrays/ (src.npy, dst.npy, node_<name>.npy) as memory maps: a rank reads its own
    share of them only."""

    def __init__(self, dataset_dir: Path) -> None:
        dataset = read_json(dataset_dir / "dataset.json")
        if dataset is None or "arrays" not in dataset:
            raise UserError(f"{dataset_dir} is not a dataset prepared with arrays/: run `dglkit prepare --arrays "
                            f"--out {dataset_dir} ...` first")
        self.dir = dataset_dir / dataset["arrays"]["dir"]
        self.dataset = dataset
        self.num_nodes: int = dataset["num_nodes"]
        self.node_data: list[str] = list(dataset["arrays"]["node_data"])
        self.src, self.dst = (np.load(self.dir / f"{name}.npy", mmap_mode="r") for name in ("src", "dst"))
        self.num_edges = len(self.src)
        self.fingerprint: str | None = dataset.get("fingerprint")
        self.types = Types.homogeneous(self.num_nodes, self.num_edges)
        self.node_data_items = [(0, name) for name in self.node_data]  # (node type's place, name)
        # The one edge type's data (edge_<name>.npy), in the order their words follow each other.
        self.edge_formats: list[list[tuple[str, RowFormat]]] = [[
            (name, RowFormat(array.dtype, array.shape[1:])) for name in dataset["arrays"].get("edge_data", [])
            for array in [np.load(self.dir / f"edge_{name}.npy", mmap_mode="r")]]]

    def segment_types(self, size: int) -> np.ndarray:
        return np.zeros(size, np.int64)

    def edge_range(self, rank: int, size: int) -> tuple[int, int]:
        starts = ranges(self.num_edges, size)
        return int(starts[rank]), int(starts[rank + 1])

    def share_edges(self, rank: int, size: int) -> int:
        begin, end = self.edge_range(rank, size)
        return end - begin

    def num_batches(self, rank: int, size: int, batch: int) -> int:
        return -(-self.share_edges(rank, size) // batch)

    def segment_starts(self, size: int) -> np.ndarray:
        """The first edge IDs of the ranks' ranges, in order (a batch lies in one)."""
        return ranges(self.num_edges, size)[:-1]

    def edge_batches(self, rank: int, size: int, batch: int = BATCH_EDGES) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """(first edge ID, src, dst) of this rank's share, `batch` edges at a time."""
        begin, end = self.edge_range(rank, size)
        for first in range(begin, end, batch):
            last = min(first + batch, end)
            yield first, np.asarray(self.src[first:last], np.int64), np.asarray(self.dst[first:last], np.int64)

    def node_rows(self, name: str, begin: int, end: int) -> np.ndarray:
        return np.asarray(np.load(self.dir / f"node_{name}.npy", mmap_mode="r")[begin:end])

    def edge_data_batches(self, rank: int, size: int, batch: int, width: int) -> Iterator[np.ndarray]:
        """Each edge_batches batch's edge data (packed_rows)."""
        columns = [(fmt, np.load(self.dir / f"edge_{name}.npy", mmap_mode="r")) for name, fmt in self.edge_formats[0]]
        begin, end = self.edge_range(rank, size)
        for first in range(begin, end, batch):
            yield packed_rows(columns, first, min(first + batch, end), width)


def open_input(dataset_dir: Path) -> "Input":
    """The dataset that dataset_dir/dataset.json describes: a graph in DGL's chunked format where it is, or the
    arrays/ that `prepare --arrays` wrote."""
    dataset = read_json(dataset_dir / "dataset.json")
    if dataset is not None and dataset.get("format") == "chunked":
        return ChunkedInput(Path(dataset["path"]), dataset.get("fingerprint"))
    return ArraysInput(dataset_dir)


class ChunkedInput:
    """A graph in DGL's chunked format (dglkit.chunked), every node and edge type as one homogeneous graph:
    the chunks of all types, in metadata order, go to the ranks round robin (chunk i to rank i mod W),
    type-local IDs become homogeneous ones by their type's offset. Node data is read per type: chunk i of a
    type's data on rank i mod W."""

    def __init__(self, root: Path, fingerprint: str | None = None) -> None:
        from dglkit import chunked

        graph = self.graph = chunked.load(root)
        self.num_nodes = sum(graph.num_nodes.values())
        self.num_edges = sum(graph.num_edges.values())
        self.types = Types(graph.node_types, np.cumsum([0] + [graph.num_nodes[t] for t in graph.node_types]),
                           graph.edge_types, np.cumsum([0] + [graph.num_edges[t] for t in graph.edge_types]),
                           graph.heterogeneous)
        if not graph.heterogeneous:  # DGL's names, whatever metadata.json calls the one type
            self.types = Types.homogeneous(self.num_nodes, self.num_edges)
        self.node_data_items = [(t, name) for t, ntype in enumerate(graph.node_types)  # (node type's place, name)
                                for name in graph.node_data.get(ntype, {})]
        # Per edge type (metadata order): its data's names and formats, in the order their words follow each other.
        self.edge_formats = [[(name, self.data_format("edge", etype, name)) for name in graph.edge_data.get(etype, {})]
                             for etype in graph.edge_types]
        self.fingerprint = fingerprint
        first_ids = np.cumsum([0] + [n for etype in graph.edge_types for n in graph.edge_chunks[etype]])
        self.chunks = [(etype, chunk) for etype in graph.edge_types for chunk in range(len(graph.edge_chunks[etype]))]
        self.first_ids = [int(first) for first in first_ids[:-1]]  # of each chunk, edge IDs in the same order

    def check(self, rank: int, size: int) -> None:
        """Read and check this rank's chunks (UserError naming the file and the fix)."""
        from dglkit import chunked

        chunked.check_chunks(self.graph, range(rank, self.graph.num_chunks, size))

    def segment_starts(self, size: int) -> np.ndarray:
        """The first edge IDs of the chunks, in edge ID order (a batch lies in one chunk)."""
        return np.array(self.first_ids, np.int64)

    def segment_types(self, size: int) -> np.ndarray:
        """The edge type (its place in metadata order) of each chunk, in edge ID order."""
        return np.array([self.graph.edge_types.index(etype) for etype, _ in self.chunks], np.int64)

    def num_batches(self, rank: int, size: int, batch: int) -> int:
        """edge_batches' count: each chunk in batches of its own."""
        return sum(-(-self.graph.edge_chunks[etype][chunk] // batch) for etype, chunk in self.chunks[rank::size])

    def edge_batches(self, rank: int, size: int, batch: int = BATCH_EDGES) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        from dglkit import chunked

        for (etype, chunk), first in list(zip(self.chunks, self.first_ids))[rank::size]:
            src, dst = chunked.read_edges(self.graph, etype, chunk)
            src_type, _, dst_type = etype.split(":")
            src += self.graph.node_offset(src_type)
            dst += self.graph.node_offset(dst_type)
            for begin in range(0, len(src), batch):
                yield first + begin, src[begin:begin + batch], dst[begin:begin + batch]

    def data_format(self, kind: str, type_name: str, name: str) -> RowFormat:
        """The dtype and row shape of node or edge data (kind: node, edge) `name` of a type (chunk 0's, which every
        chunk shares: checked)."""
        from dglkit import chunked

        first = (self.graph.node_data if kind == "node" else self.graph.edge_data)[type_name][name][0]
        return RowFormat(*chunked.data_header(first, self.graph.formats[first]))

    def data_rows(self, kind: str, type_name: str, name: str, chunk: int) -> np.ndarray:
        """Chunk `chunk` of node or edge data (kind: node, edge): a .npy chunk mapped, so that only the rows taken
        from it are read into memory; a csv chunk read."""
        from dglkit import chunked

        path = (self.graph.node_data if kind == "node" else self.graph.edge_data)[type_name][name][chunk]
        if self.graph.formats[path].name == "numpy":
            return chunked.load_npy(path, mmap=True)
        read = chunked.read_node_data if kind == "node" else chunked.read_edge_data
        return read(self.graph, type_name, name, chunk)

    def node_chunks(self, t: int, rank: int, size: int) -> list[int]:
        """The row counts of this rank's chunks of node type t's data."""
        return self.graph.node_chunks[self.graph.node_types[t]][rank::size]

    def node_batches(self, t: int, name: str, rank: int, size: int, batch: int
                     ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(homogeneous node IDs, their rows) of this rank's chunks of node type t's data `name`, `batch` rows at
        a time."""
        ntype = self.graph.node_types[t]
        counts, offset = self.graph.node_chunks[ntype], self.graph.node_offset(ntype)
        for chunk in range(rank, len(counts), size):
            rows = self.data_rows("node", ntype, name, chunk)
            first = offset + sum(counts[:chunk])
            for begin in range(0, len(rows), batch):
                end = min(begin + batch, len(rows))
                yield np.arange(first + begin, first + end, dtype=np.int64), np.asarray(rows[begin:end])

    def edge_data_batches(self, rank: int, size: int, batch: int, width: int) -> Iterator[np.ndarray]:
        """Each edge_batches batch's edge data (packed_rows)."""
        for etype, chunk in self.chunks[rank::size]:
            fields = self.edge_formats[self.graph.edge_types.index(etype)]
            columns = [(fmt, self.data_rows("edge", etype, name, chunk)) for name, fmt in fields]
            count = self.graph.edge_chunks[etype][chunk]
            for begin in range(0, count, batch):
                yield packed_rows(columns, begin, min(begin + batch, count), width)


def packed_rows(columns: list[tuple[RowFormat, np.ndarray]], begin: int, end: int, width: int) -> np.ndarray:
    """Rows begin .. end - 1 of an edge type's data arrays as they travel with their edges: a row per edge, the
    words of each array's row one after another (edge_formats' order), zero-padded to `width` words (the widest
    type's)."""
    packed = np.zeros((end - begin, width), np.int64)
    offset = 0
    for fmt, rows in columns:
        packed[:, offset:offset + fmt.words] = fmt.pack(np.asarray(rows[begin:end]))
        offset += fmt.words
    return packed


# What the MPI programs read: a dataset's arrays/ or a chunked graph.
Input = ArraysInput | ChunkedInput


def check_input(comm: Any, data: Input) -> None:
    """Every rank checks its chunks of a chunked graph before any exchange; a bad chunk on any rank refuses the
    run on every rank with each rank's finding (mpi_main prints rank 0's UserError). Collective."""
    if not isinstance(data, ChunkedInput):
        return
    try:
        data.check(comm.Get_rank(), comm.Get_size())
        problem = None
    except UserError as error:
        problem = str(error)
    problems = list(dict.fromkeys(p for p in comm.allgather(problem) if p))
    if problems:
        raise UserError("; ".join(problems))


def rounds(comm: Any, batches: int) -> int:
    """The number of exchange rounds: the most batches any rank has (every rank takes part in each)."""
    from mpi4py import MPI

    return int(comm.allreduce(batches, op=MPI.MAX))


def padded(batches: Iterator[tuple[int, np.ndarray, np.ndarray]], count: int
           ) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """`batches`, then empty ones up to `count` in all: a rank whose share is done still joins each round."""
    empty = np.zeros(0, np.int64)
    done = 0
    for item in batches:
        done += 1
        PROGRESS.step(done, count)
        yield item
    for extra in range(done, count):
        PROGRESS.step(extra + 1, count)
        yield 0, empty, empty


def mpi_main(program: Callable[[Any, list[str]], int]) -> None:
    """Run program(comm, argv) on every rank. A UserError (the same check fails on every rank, before any
    collective call) exits 2 with its message from rank 0; any other error aborts every rank, so that mpirun
    exits non-zero instead of the others waiting forever in a collective call."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    try:
        PROGRESS.start(comm.Get_rank(), Path(sys.argv[0]).stem)
        code = program(comm, sys.argv[1:])
    except UserError as error:
        if comm.Get_rank() == 0:
            print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    except SystemExit:  # argparse's usage errors and --help: the same on every rank
        raise
    except BaseException:  # noqa: BLE001 - any failure must take the other ranks down too
        traceback.print_exc()
        sys.stderr.flush()
        comm.Abort(1)
    sys.exit(code)
