"""dglkit/launcher/outside.py: what a launcher makes of a trainer that exits with an error while something outside
this node is under way."""
import argparse
import json
import threading
from pathlib import Path

from dglkit import jobstate
from dglkit.launcher.node import Node
from dglkit.launcher.outside import check_outside, peer_failed_first


def node_of(job_dir: Path) -> Node:
    node_dir = job_dir / "nodes" / "n1"
    node_dir.mkdir(parents=True)
    cfg = argparse.Namespace(node_name="n1", nodes=["n1", "n2"], max_restarts=2)
    return Node(cfg, {"job_dir": job_dir, "node_dir": node_dir})


def test_a_trainer_that_lost_its_peer_during_a_stop_is_stopped_not_failed(tmp_path: Path):
    """stop.yml writes STOP, then stops every unit: a trainer here may lose its peer on another node and exit with
    an error before this node's own unit is stopped. Within the settle time the STOP shows: the node stops, and no
    FAILED is written (which would end the stop as a failure)."""
    node = node_of(tmp_path)
    threading.Timer(0.5, (tmp_path / "STOP").touch).start()
    assert peer_failed_first(node) is True
    assert node.state == "stopped" and not (tmp_path / "FAILED").exists()


def test_a_trainer_that_failed_alone_is_left_to_its_own_failure(tmp_path: Path):
    node = node_of(tmp_path)
    assert peer_failed_first(node) is False and node.state == "starting"


def test_a_failed_file_with_a_field_of_the_wrong_type_stops_the_node_as_it_fails_the_job_in_watch(tmp_path: Path):
    """The launchers read FAILED as `dglkit watch` does (dglkit/jobfiles.py): an attempt that is not a number counts
    as absent (attempt 1), so the node whose job watch reports failed stops too instead of running on."""
    node = node_of(tmp_path)
    node.attempt = 1
    (tmp_path / "FAILED").write_text(json.dumps({"node": "n2", "process": "trainer-1", "attempt": "1", "reason": 7}))
    assert node.failed_record() == {"node": "n2", "process": "trainer-1"}
    assert check_outside(node) is True and node.state == "failed"
    assert jobstate.snapshot(tmp_path, ["n1", "n2"], 120, final=False)["state"] == "failed"
