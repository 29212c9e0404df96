"""Training checkpoints in the job directory, so that a restart (or `dgl_job_resume`) continues where a run
stopped: the dense model and optimizer, the epoch, every trainer's RNG state, the metrics so far and the
best-validation model in `checkpoint.pt`; learnt embeddings (DistEmbedding) and DGL's sparse optimizer state in
one file per trainer beside it, `checkpoint-sparse/<epoch>-<rank>.pt`, each trainer's share of the rows as
DGL's own SparseAdam.save divides them.

A crash while writing leaves the previous checkpoint whole: checkpoint.pt is replaced atomically after every
trainer has written its rows for the new one, and older rows are removed only then. Both functions are
collective: every trainer calls them.
"""

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dglkit.common import CHECKPOINT, CHECKPOINT_SPARSE, beat


def rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def sparse_rows(task: Any) -> dict:
    """This trainer's rows of every learnt embedding and their optimizer state."""
    state = task.sparse_optimizer.local_state_dict()
    rows = {name: emb_state["ids"] for name, emb_state in state["emb_states"].items()}
    weights = {emb.name: emb.weight[rows[emb.name]] for emb in task.embeddings.values()}
    return {"optimizer": state, "weights": weights}


def save(out_dir: Path, task: Any, epoch: int, metrics: list[dict], best: dict) -> None:
    """Checkpoint after `epoch` (0-based)."""
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    if task.embeddings:
        beat()
        (out_dir / CHECKPOINT_SPARSE).mkdir(exist_ok=True)
        torch.save(sparse_rows(task), out_dir / CHECKPOINT_SPARSE / f"{epoch}-{rank}.pt")
    # Also the barrier after which every trainer's rows are on disk.
    states: list = [None] * world
    torch.distributed.all_gather_object(states, rng_state())
    if rank != 0:
        return
    beat()
    tmp = out_dir / f".{CHECKPOINT}.tmp"
    torch.save({"epoch": epoch, "model": task.model.module.state_dict(), "optimizer": task.optimizer.state_dict(),
                "rng": states, "metrics": metrics, "best": best, "sparse_ranks": world if task.embeddings else 0},
               tmp)
    os.replace(tmp, out_dir / CHECKPOINT)
    for old in (out_dir / CHECKPOINT_SPARSE).glob("*.pt") if task.embeddings else ():
        if not old.name.startswith(f"{epoch}-"):
            old.unlink()
    beat()


def load(out_dir: Path, task: Any) -> tuple[int, list[dict], dict | None, int]:
    """Restore the last checkpoint if there is one: (first epoch to run, metrics so far, best model record,
    rows of learnt embeddings restored by all trainers together)."""
    path = out_dir / CHECKPOINT
    if not path.is_file():
        return 0, [], None, 0
    checkpoint = torch.load(path, map_location="cpu")
    task.model.module.load_state_dict(checkpoint["model"])
    task.optimizer.load_state_dict(checkpoint["optimizer"])
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    saved_world = checkpoint.get("sparse_ranks", 0)
    restored = torch.zeros(1, dtype=torch.int64)
    if task.embeddings and saved_world:
        # With fewer trainers than before, each also takes over the rows of the ranks that are gone.
        for saved_rank in range(rank, saved_world, world):
            restored += load_sparse_rows(task, torch.load(out_dir / CHECKPOINT_SPARSE / f"{checkpoint['epoch']}-{saved_rank}.pt"))
        # Also the barrier after which every row is back on the servers.
        torch.distributed.all_reduce(restored)
    states = checkpoint["rng"]
    # The same number of trainers gets its own streams back; another number starts from rank 0's.
    state = states[rank] if len(states) == world else states[0]
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    return checkpoint["epoch"] + 1, checkpoint["metrics"], checkpoint.get("best"), int(restored)


def load_sparse_rows(task: Any, saved: dict) -> int:
    """Put one trainer's saved rows back: embedding weights and optimizer state. Returns the rows."""
    optimizer_state = saved["optimizer"]
    # DGL's own load drops the world size it saved before restoring the rest (SparseAdam._load_state_from).
    optimizer_state["params"].pop("world_size", None)
    task.sparse_optimizer.load_local_state_dict(optimizer_state)
    rows = 0
    for emb in task.embeddings.values():
        ids = optimizer_state["emb_states"][emb.name]["ids"]
        emb.weight[ids] = saved["weights"][emb.name]
        rows += len(ids)
    return rows
