"""The embedded store: a real redis-server the gateway runs, keeping its data in a file."""

from __future__ import annotations

from pathlib import Path

import msgspec
import redis

from gateway.settings import load_settings
from gateway.workers.pool import embedded_data_file, needs_embedded_redis, worker_settings
from gateway.workers.redis import EmbeddedRedis


def test_its_data_survives_a_restart(tmp_path: Path) -> None:
    data = tmp_path / "state" / "tenancy.rdb"
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
    first = EmbeddedRedis(tmp_path / "a", data).start()
    try:
        redis.Redis(unix_socket_path=str(first.socket)).set("tgw:tenant", "changed")
    finally:
        first.stop()
    assert data.is_file()
    second = EmbeddedRedis(tmp_path / "b", data).start()
    try:
        assert redis.Redis(unix_socket_path=str(second.socket)).get("tgw:tenant") == b"changed"
    finally:
        second.stop()


def test_the_settings_name_it_and_its_file_beside_them(tmp_path: Path) -> None:
    (tmp_path / "gateway.yaml").write_text(
        "tenancy: {auth: false, store: {kind: embedded, path: tenancy.rdb}}\n"
    )
    settings = load_settings(tmp_path / "gateway.yaml")
    assert needs_embedded_redis(settings)
    assert embedded_data_file(settings) == tmp_path / "tenancy.rdb"
    shared = worker_settings(settings, EmbeddedRedis(tmp_path))
    assert shared.tenancy.store.kind == "redis"
    assert shared.tenancy.store.url == f"unix://{tmp_path / 'redis.sock'}"


def test_memory_is_kept_only_with_one_worker(tmp_path: Path) -> None:
    (tmp_path / "gateway.yaml").write_text("tenancy: {auth: false, store: {kind: memory}}\n")
    settings = load_settings(tmp_path / "gateway.yaml")
    assert not needs_embedded_redis(settings)
    two = msgspec.structs.replace(
        settings, server=msgspec.structs.replace(settings.server, workers=2)
    )
    assert needs_embedded_redis(two)
    assert embedded_data_file(two) is None
