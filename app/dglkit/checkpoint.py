"""Training checkpoints in the job directory: model, optimizer, epoch, every trainer's RNG state, the metrics
so far and the best-validation model, written atomically by rank 0 so that a restart (or `dgl_job_resume`) continues where it stopped.

Called by every trainer (both functions are collective: they gather or read on all ranks).
"""

import os
import random
from pathlib import Path

import numpy as np
import torch

from dglkit.common import beat

NAME = "checkpoint.pt"


def rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def save(out_dir: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, epoch: int,
         metrics: list[dict], best: dict | None = None) -> None:
    """Checkpoint after `epoch` (0-based). A crash while writing leaves the previous checkpoint whole."""
    states = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(states, rng_state())
    if torch.distributed.get_rank() != 0:
        return
    beat()
    tmp = out_dir / f".{NAME}.tmp"
    torch.save({"epoch": epoch, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "rng": states, "metrics": metrics, "best": best}, tmp)
    os.replace(tmp, out_dir / NAME)
    beat()


def load(out_dir: Path, model: torch.nn.Module,
         optimizer: torch.optim.Optimizer) -> tuple[int, list[dict], dict | None]:
    """Restore the last checkpoint if there is one: (first epoch to run, metrics so far, best model record)."""
    path = out_dir / NAME
    if not path.is_file():
        return 0, [], None
    checkpoint = torch.load(path, map_location="cpu")
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    states = checkpoint["rng"]
    # The same number of trainers gets its own streams back; another number starts from rank 0's.
    rank = torch.distributed.get_rank()
    state = states[rank] if len(states) == torch.distributed.get_world_size() else states[0]
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    return checkpoint["epoch"] + 1, checkpoint["metrics"], checkpoint.get("best")
