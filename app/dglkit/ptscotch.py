"""PT-Scotch, the distributed graph partitioner, through ctypes: Debian's int64 build (`ptscotch`,
`libptscotch-dev`; SCOTCH_Num is a 64-bit integer, so graphs past 2^31 edges fit) on Open MPI.

Each MPI rank gives its share of a symmetric simple graph as a local CSR over a contiguous range of vertices
(neighbours as global IDs) and gets back the part of each of its vertices. Every C function's argument types
are declared: ctypes would otherwise pass 64-bit pointers and integers as C ints.
"""

import ctypes
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

LIBRARY_DIR = Path("/usr/lib/x86_64-linux-gnu/scotch-int64")
# In this order and global: each library resolves its symbols in the ones before it.
LIBRARIES = ("libscotcherr-7.0.so", "libscotch-7.0.so", "libptscotch-7.0.so")
# SCOTCH_STRAT* flags of scotch.h.
STRATEGIES = {"default": 0x0, "quality": 0x1, "speed": 0x2, "balance": 0x4}
# SCOTCH_OPTIONNUM* context options of scotch.h.
OPTION_DETERMINISTIC, OPTION_FIXED_SEED = 0, 1

_P, _NUM, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
SIGNATURES: dict[str, tuple[list[Any], Any]] = {
    "SCOTCH_dgraphAlloc": ([], _P),
    "SCOTCH_stratAlloc": ([], _P),
    "SCOTCH_memFree": ([_P], None),
    "SCOTCH_dgraphInit": ([_P, _P], _INT),  # Open MPI's MPI_Comm is a pointer
    "SCOTCH_dgraphBuild": ([_P, _NUM, _NUM, _NUM, _P, _P, _P, _P, _NUM, _NUM, _P, _P, _P], _INT),
    "SCOTCH_dgraphCheck": ([_P], _INT),
    "SCOTCH_dgraphExit": ([_P], None),
    "SCOTCH_stratInit": ([_P], _INT),
    "SCOTCH_stratExit": ([_P], None),
    "SCOTCH_stratDgraphMapBuild": ([_P, _NUM, _NUM, _NUM, ctypes.c_double], _INT),
    "SCOTCH_dgraphPart": ([_P, _NUM, _P, _P], _INT),
    "SCOTCH_contextAlloc": ([], _P),
    "SCOTCH_contextInit": ([_P], _INT),
    "SCOTCH_contextExit": ([_P], None),
    "SCOTCH_contextOptionSetNum": ([_P, _INT, _NUM], _INT),
    "SCOTCH_contextRandomSeed": ([_P, _NUM], None),
    "SCOTCH_contextBindDgraph": ([_P, _P, _P], _INT),
}

_library: ctypes.CDLL | None = None


class ScotchError(RuntimeError):
    """A PT-Scotch call that returned an error code (PT-Scotch prints its own message on stderr)."""

    def __init__(self, call: str, code: int) -> None:
        super().__init__(f"{call} failed with PT-Scotch error code {code}")
        self.call, self.code = call, code


def library(directory: Path = LIBRARY_DIR) -> ctypes.CDLL:
    """PT-Scotch's library with every function used here typed; loaded once per process."""
    global _library
    if _library is None:
        missing = [name for name in LIBRARIES if not (directory / name).is_file()]
        if missing:
            raise FileNotFoundError(f"PT-Scotch's int64 libraries {missing} are not in {directory}: install the "
                                    "Debian packages ptscotch and libptscotch-dev")
        for name in LIBRARIES:
            lib = ctypes.CDLL(str(directory / name), mode=ctypes.RTLD_GLOBAL)
        for function, (argtypes, restype) in SIGNATURES.items():
            getattr(lib, function).argtypes, getattr(lib, function).restype = argtypes, restype
        _library = lib
    return _library


def check(call: str, code: int) -> None:
    if code:
        raise ScotchError(call, code)


def int64_array(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array, dtype=np.int64)


def made(cleanup: ExitStack, pointer: int, init: str = "", *args: Any) -> int:
    """A PT-Scotch object from its Alloc, initialised by `init` (SCOTCH_<kind>Init) when given; its Exit and
    the freeing of its memory are left to `cleanup`."""
    lib = library()
    cleanup.callback(lib.SCOTCH_memFree, pointer)
    if init:
        check(init, getattr(lib, init)(pointer, *args))
        cleanup.callback(getattr(lib, init.replace("Init", "Exit")), pointer)
    return pointer


def partition(comm: Any, indptr: np.ndarray, indices: np.ndarray, num_parts: int,
              weights: np.ndarray | None = None, strategy: str = "quality", imbalance: float = 0.03,
              seed: int = 0) -> np.ndarray:
    """The part (0 .. num_parts - 1) of each of this rank's vertices; collective over the mpi4py communicator
    `comm`. Rank r holds vertices offset_r .. offset_r + len(indptr) - 2, in rank order; `indices` are global
    IDs, every edge present in both directions, no self loops or duplicates. `weights` (one per local vertex,
    >= 1) are what the parts balance, to within `imbalance` (a fraction); without them, vertex counts. `seed`
    seeds PT-Scotch's random generator, so that a run can be repeated."""
    from mpi4py import MPI

    lib = library()
    indptr, indices = int64_array(indptr), int64_array(indices)
    weights = None if weights is None else int64_array(weights)
    num_local, num_edges = len(indptr) - 1, int(indptr[-1])
    parts = np.zeros(num_local, np.int64)
    with ExitStack() as cleanup:  # frees what was made, in reverse order, whatever fails
        graph = made(cleanup, lib.SCOTCH_dgraphAlloc(), "SCOTCH_dgraphInit", MPI._handleof(comm))
        check("SCOTCH_dgraphBuild", lib.SCOTCH_dgraphBuild(
            graph, 0, num_local, num_local, indptr.ctypes.data, indptr[1:].ctypes.data,
            None if weights is None else weights.ctypes.data, None, num_edges, num_edges,
            indices.ctypes.data, None, None))
        check("SCOTCH_dgraphCheck", lib.SCOTCH_dgraphCheck(graph))
        # A context that makes PT-Scotch deterministic (its threads otherwise race) with a fixed seed.
        context = made(cleanup, lib.SCOTCH_contextAlloc(), "SCOTCH_contextInit")
        for option in (OPTION_DETERMINISTIC, OPTION_FIXED_SEED):
            check("SCOTCH_contextOptionSetNum", lib.SCOTCH_contextOptionSetNum(context, option, 1))
        lib.SCOTCH_contextRandomSeed(context, seed)
        bound = made(cleanup, lib.SCOTCH_dgraphAlloc())
        check("SCOTCH_contextBindDgraph", lib.SCOTCH_contextBindDgraph(context, graph, bound))
        cleanup.callback(lib.SCOTCH_dgraphExit, bound)
        strat = made(cleanup, lib.SCOTCH_stratAlloc(), "SCOTCH_stratInit")
        check("SCOTCH_stratDgraphMapBuild", lib.SCOTCH_stratDgraphMapBuild(
            strat, STRATEGIES[strategy], comm.Get_size(), num_parts, imbalance))
        check("SCOTCH_dgraphPart", lib.SCOTCH_dgraphPart(bound, num_parts, strat, parts.ctypes.data))
    return parts
