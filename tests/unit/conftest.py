"""Shared fixtures: a small synthetic dataset and its partitions, built once per session through the CLI's
entry point (in this process: a child would spend seconds importing dgl again) into a temporary directory;
`dglkit` runs the CLI as a child process, `cli` in this process."""

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from localjob import TRAIN_ARGS, build, start_local_job, stop_started_launchers

APP = Path(__file__).resolve().parents[2] / "app"
# Big enough for GraphSAGE to beat chance clearly in a few epochs, small enough to partition in a second.
SYNTHETIC = ["--num-nodes", "4000", "--avg-degree", "12", "--num-classes", "5", "--feat-dim", "32",
             "--train-frac", "0.5", "--val-frac", "0.2", "--test-frac", "0.3", "--seed", "7"]


def run_cli(*args: object, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m dglkit ARGS` in a child process with stdin closed; check=True requires exit 0."""
    env = {**os.environ, "PYTHONPATH": str(APP), "DGLBACKEND": "pytorch"}
    proc = subprocess.run([sys.executable, "-m", "dglkit", *map(str, args)], capture_output=True, text=True,
                          env=env, stdin=subprocess.DEVNULL, timeout=timeout)
    if check and proc.returncode:
        raise AssertionError(f"dglkit {args} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return proc


def last_json(output: str) -> dict:
    """The result line every command prints last (docs/design.md)."""
    return json.loads(output.strip().splitlines()[-1])


@pytest.fixture(autouse=True)
def stop_leftover_launchers() -> Iterator[None]:
    """A test that fails while its launcher runs must not leave it (and its servers and trainers) to the next."""
    yield
    stop_started_launchers()


@pytest.fixture(scope="session")
def dglkit() -> Callable[..., subprocess.CompletedProcess]:
    return run_cli


@pytest.fixture(scope="session")
def synthetic_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Directory with graph.dgl, dataset.json and arrays/: 4000 nodes, 5 classes, 32 features."""
    out = tmp_path_factory.mktemp("data") / "synthetic"
    build("prepare", "--dataset", "synthetic", "--out", out, *SYNTHETIC, "--arrays")
    return out


@pytest.fixture(scope="session")
def chunked_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A homogeneous graph written by `dglkit chunked generate` (3 chunks of 1000 nodes, 5 float32 features: rows
    of 20 bytes), prepared as a chunked dataset where it is (dataset.json only)."""
    directory = tmp_path_factory.mktemp("chunked")
    build("chunked", "generate", "--out", directory / "chunks", "--num-chunks", 3, "--num-nodes", 3000,
          "--avg-degree", 8, "--num-classes", 4, "--feat-dim", 5, "--seed", 3)
    build("prepare", "--dataset", "chunked", "--path", directory / "chunks", "--out", directory / "dataset")
    return directory / "dataset"


@pytest.fixture(scope="session")
def make_partition(synthetic_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """make_partition(num_parts, graphbolt=False, builder="lean") -> the partition config (<dir>/graph.json),
    built once."""
    built: dict[tuple[int, bool, str], Path] = {}

    def make(num_parts: int, graphbolt: bool = False, builder: str = "lean") -> Path:
        if (num_parts, graphbolt, builder) not in built:
            out = tmp_path_factory.mktemp("parts") / f"{num_parts}{'-graphbolt' if graphbolt else ''}-{builder}"
            build("partition", "--dataset-dir", synthetic_dataset, "--out", out, "--num-parts", num_parts,
                  "--graph-name", "graph", "--builder", builder, *(["--graphbolt"] if graphbolt else []))
            built[num_parts, graphbolt, builder] = out / "graph.json"
        return built[num_parts, graphbolt, builder]

    return make


@pytest.fixture(scope="session")
def partition_1(make_partition: Callable[..., Path]) -> Path:
    return make_partition(1)


@pytest.fixture(scope="session")
def partition_2(make_partition: Callable[..., Path]) -> Path:
    return make_partition(2)


@pytest.fixture(scope="session")
def partition_2_graphbolt(make_partition: Callable[..., Path]) -> Path:
    return make_partition(2, graphbolt=True)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture) -> Callable[..., tuple[int, dict | None, str]]:
    """The CLI in this process (no second `import dgl`): cli(*args) -> (exit code, result line, stderr)."""
    from dglkit.__main__ import main

    def call(*args: object) -> tuple[int, dict | None, str]:
        code = main([str(arg) for arg in args])
        out, err = capsys.readouterr()
        return code, last_json(out) if code == 0 else None, err.strip()

    return call


# The launcher's tests share one finished --local job.
@pytest.fixture(scope="session")
def finished_local_job(make_partition: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A whole --local job (2 servers, 2 trainers, GraphBolt) with embeddings and predictions, run to the end."""
    job_dir = tmp_path_factory.mktemp("jobs") / "local"
    launch, _ = start_local_job(job_dir, make_partition(1, graphbolt=True), "node0", servers=2,
                                train_args=[*TRAIN_ARGS, "--graphbolt", "--save-embeddings", "--save-predictions"])
    code = launch.wait(timeout=240)
    assert code == 0, (job_dir / "launch.out").read_text()[-3000:]
    return job_dir
