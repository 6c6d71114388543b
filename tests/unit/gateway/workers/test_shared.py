"""The state a gateway's parent writes for its workers: sidecar addresses and whether each runs
with the response keeper."""

from __future__ import annotations

import json
from pathlib import Path

from gateway.runtime.shared import SidecarView, read_state, write_state

SIDECAR = SidecarView(
    "a", "127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3/metrics", 7, 0, True
)


def test_workers_read_the_sidecars_as_written(tmp_path: Path) -> None:
    path = tmp_path / "sidecars.json"
    write_state(path, [SIDECAR], ready=True)
    state = read_state(path)
    assert state.sidecars == (SIDECAR,)
    assert state.ready
    assert read_state(tmp_path / "absent.json").sidecars == ()


def test_a_sidecar_written_without_the_keeper_reads_as_without(tmp_path: Path) -> None:
    path = tmp_path / "sidecars.json"
    view = {"name": "a", "grpc_url": "g", "http_url": "h", "metrics_url": "m", "pid": 1}
    path.write_text(json.dumps({"ready": True, "sidecars": [{**view, "restarts": 0}]}))
    assert read_state(path).sidecars[0].keeps_responses is False
