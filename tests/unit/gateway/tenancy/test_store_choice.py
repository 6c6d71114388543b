"""Which store a gateway runs when its settings name none: the embedded one, kept beside the
settings file, wherever there are tenants to keep; memory only when named, or with nothing to
keep, or for an app built in code."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from gateway.settings import Settings, SettingsError, check_settings, parse_settings
from gateway.tenancy.config import resolve_store

ADMIN = "a" * 64
KEYS = [{"tenant": "team", "sha256": "b" * 64}]
TEAM = [{"name": "team"}]
FOLDER = Path("/srv/gateway")


@pytest.mark.parametrize(
    ("tenancy", "folder", "workers", "kind", "path"),
    [
        ({"admin_key_sha256": ADMIN}, FOLDER, 1, "embedded", "/srv/gateway/tenancy.rdb"),
        ({"tenants": TEAM, "keys": KEYS}, FOLDER, 1, "embedded", "/srv/gateway/tenancy.rdb"),
        ({"auth": False, "tenants": TEAM}, FOLDER, 1, "embedded", "/srv/gateway/tenancy.rdb"),
        ({"admin_key_sha256": ADMIN, "store": {"path": "/d/t.rdb"}}, FOLDER, 1, "embedded",
         "/d/t.rdb"),
        ({"auth": False}, FOLDER, 1, "memory", None),
        ({"auth": False}, FOLDER, 4, "embedded", None),
        ({"admin_key_sha256": ADMIN}, None, 1, "memory", None),
        ({"admin_key_sha256": ADMIN}, None, 2, "embedded", None),
        ({"admin_key_sha256": ADMIN, "store": {"kind": "memory"}}, FOLDER, 1, "memory", None),
        ({"admin_key_sha256": ADMIN, "store": {"kind": "redis"}}, FOLDER, 1, "redis", None),
        ({"admin_key_sha256": ADMIN, "store": {"kind": "embedded"}}, FOLDER, 1, "embedded",
         None),
    ],
)  # fmt: skip
def test_a_store_left_unnamed_is_chosen_by_what_there_is_to_keep(
    tenancy: dict[str, Any], folder: Path | None, workers: int, kind: str, path: str | None
) -> None:
    settings = parse_settings({"tenancy": tenancy})
    assert settings.tenancy.store.kind == "auto" or "kind" in tenancy.get("store", {})
    chosen = resolve_store(settings.tenancy, settings_dir=folder, workers=workers).store
    assert (chosen.kind, chosen.path) == (kind, path)


def test_settings_built_in_code_leave_the_choice_to_whoever_serves_them() -> None:
    assert Settings().tenancy.store.kind == "auto"


def test_memory_named_for_several_workers_is_refused_with_what_to_change() -> None:
    settings = parse_settings({"tenancy": {"auth": False, "store": {"kind": "memory"}}})
    several = msgspec.structs.replace(
        settings, server=msgspec.structs.replace(settings.server, workers=3)
    )
    check_settings(settings)
    with pytest.raises(SettingsError, match="memory counts limits in each of the 3 workers") as e:
        check_settings(several)
    assert "leave tenancy.store.kind unset" in str(e.value)


def test_a_store_file_in_a_folder_that_cannot_be_written_is_refused_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis could not save there: the admin API's changes would be lost on restart. (Checked
    through ``os.access``, which root passes anywhere, so the refusal is stood in for.)"""
    from gateway.ops import preflight

    store = {"kind": "embedded", "path": str(tmp_path / "ro" / "tenancy.rdb")}
    settings = parse_settings({"tenancy": {"auth": False, "store": store}})
    preflight.check_before_start(settings, None)
    monkeypatch.setattr(preflight.os, "access", lambda path, mode: False)
    with pytest.raises(SettingsError, match=r"tenancy.store.path: the folder .*ro cannot be"):
        preflight.check_before_start(settings, None)
