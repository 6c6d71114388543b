"""Pure rules of tenancy's run-time changes: policy edits, and the file versus Redis."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from gateway.errors import InvalidRequestError
from gateway.http.answers import decode_body
from gateway.ops.metrics import metrics_need_admin_key
from gateway.settings import Settings, SettingsError, check_settings, parse_settings
from gateway.tenancy.config import KeyEntry, PolicyError, TenancySettings, TenantPolicy
from gateway.tenancy.edits import FIELDS, TenantFields, apply_fields, missing_fields
from gateway.tenancy.service import digest
from gateway.tenancy.state import RunTimeChanges, differences, in_force

SEARCH = TenantPolicy(
    name="search",
    models=("small", "small-*"),
    requests_per_minute=600,
    tokens_per_minute=200_000,
    tokens_per_day=50_000_000,
    max_concurrency=16,
    max_tokens=4096,
    priority=1,
    burst=0.1,
)


def fields(body: dict[str, Any]) -> TenantFields:
    return decode_body(json.dumps(body).encode(), TenantFields)


def test_the_admin_fields_are_the_policys_fields_but_its_name() -> None:
    assert set(FIELDS) == set(TenantPolicy.__struct_fields__) - {"name"}


@pytest.mark.parametrize(
    ("body", "changed"),
    [
        ({"requests_per_minute": 100}, {"requests_per_minute": 100}),
        ({"max_tokens": None}, {"max_tokens": None}),
        ({"tokens_per_day": None, "priority": 2}, {"tokens_per_day": None, "priority": 2}),
        ({"models": ["*"], "burst": 1.0}, {"models": ("*",), "burst": 1.0}),
        ({}, {}),
    ],
    ids=["one-limit", "null-lifts", "two", "widen-on-purpose", "nothing"],
)
def test_a_patch_changes_only_the_fields_it_sends(
    body: dict[str, Any], changed: dict[str, Any]
) -> None:
    assert apply_fields(SEARCH, fields(body)) == msgspec.structs.replace(SEARCH, **changed)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"burst": 0}, "burst"),
        ({"burst": 1.5}, "burst"),
        ({"requests_per_minute": 0}, "requests_per_minute"),
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"max_tokens": -3}, "max_tokens"),
    ],
)
def test_a_patch_that_cannot_work_names_its_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(PolicyError) as caught:
        apply_fields(SEARCH, fields(body))
    assert caught.value.field == field


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"priority": None}, "priority"),
        ({"burst": None}, "burst"),
        ({"models": None}, "models"),
        ({"models": "small"}, "models"),
        ({"name": "other"}, "name"),
        ({"requests_per_mnute": 5}, "requests_per_mnute"),
    ],
    ids=["null-priority", "null-burst", "null-models", "string-models", "name", "typo"],
)
def test_bodies_that_do_not_decode_name_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        fields(body)
    assert caught.value.param == param


@pytest.mark.parametrize(
    ("body", "missing"),
    [
        ({}, [f for f in FIELDS if f != "cache_scope"]),
        (
            {"requests_per_minute": 100},
            [f for f in FIELDS if f not in ("requests_per_minute", "cache_scope")],
        ),
        (msgspec.to_builtins(SEARCH), []),
        ({**msgspec.to_builtins(SEARCH), "max_tokens": None}, []),
    ],
    ids=["empty", "one", "all", "all-with-a-null"],
)
def test_missing_fields(body: dict[str, Any], missing: list[str]) -> None:
    body = {k: v for k, v in body.items() if k != "name"}
    assert missing_fields(fields(body)) == missing


def key(tenant: str, name: str) -> KeyEntry:
    return KeyEntry(tenant=tenant, sha256=digest(name), name=name)


FILE = TenancySettings(
    tenants=(TenantPolicy(name="a"), TenantPolicy(name="b", requests_per_minute=60)),
    keys=(key("a", "ka"), key("b", "kb"), key("b", "kb2")),
)
PATCHED_B = TenantPolicy(name="b", requests_per_minute=10, max_tokens=5)


@pytest.mark.parametrize(
    ("changes", "tenants", "keys", "lines"),
    [
        (RunTimeChanges(), {"a": FILE.tenants[0], "b": FILE.tenants[1]}, ["ka", "kb", "kb2"], []),
        (
            RunTimeChanges(deleted=frozenset({"b"}), revoked=frozenset({digest("kb")})),
            {"a": FILE.tenants[0]},
            ["ka"],
            [
                "tenant b: deleted at run time; the settings file's definition is not in force",
                f"key {digest('kb')[:12]} of tenant b: revoked at run time; the settings file's "
                "entry is not in force",
                f"key {digest('kb2')[:12]} of tenant b: in the settings file, but its tenant was "
                "deleted at run time",
            ],
        ),
        (
            RunTimeChanges(tenants={"b": PATCHED_B}),
            {"a": FILE.tenants[0], "b": PATCHED_B},
            ["ka", "kb", "kb2"],
            [
                "tenant b: the run-time policy is in force; it differs from the settings file's "
                "in requests_per_minute, max_tokens"
            ],
        ),
        (
            RunTimeChanges(
                tenants={"b": PATCHED_B}, revoked=frozenset({digest("kb"), digest("kb2")})
            ),
            {"a": FILE.tenants[0], "b": PATCHED_B},
            ["ka"],
            [
                "tenant b: the run-time policy is in force; it differs from the settings file's "
                "in requests_per_minute, max_tokens",
                f"key {digest('kb')[:12]} of tenant b: revoked at run time; the settings file's "
                "entry is not in force",
                f"key {digest('kb2')[:12]} of tenant b: revoked at run time; the settings file's "
                "entry is not in force",
            ],
        ),
        (
            RunTimeChanges(tenants={"c": TenantPolicy(name="c")}, keys=(key("c", "kc"),)),
            {"a": FILE.tenants[0], "b": FILE.tenants[1], "c": TenantPolicy(name="c")},
            ["ka", "kb", "kb2", "kc"],
            [
                "tenant c: created at run time (the settings file has none)",
                "1 key(s) made at run time are in force",
            ],
        ),
        (
            RunTimeChanges(tenants={"b": FILE.tenants[1]}),
            {"a": FILE.tenants[0], "b": FILE.tenants[1]},
            ["ka", "kb", "kb2"],
            [],
        ),
    ],
    ids=["untouched", "deleted-and-revoked", "patched", "recreated-after-delete", "added", "same"],
)
def test_run_time_changes_win_for_what_they_touch(
    changes: RunTimeChanges, tenants: dict[str, TenantPolicy], keys: list[str], lines: list[str]
) -> None:
    snapshot = in_force(FILE, changes)
    assert snapshot.tenants == tenants
    assert sorted(k.name for k in snapshot.keys.values()) == keys
    assert differences(FILE, changes) == lines
    for name in ("ka", "kb", "kb2", "kc"):
        assert (digest(name) in snapshot.keys) is (name in keys)


SHA = "a" * 64


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"tenancy": {"auth": False}, "observability": {"metrics": {"auth": "admin"}}},
            "needs the admin key",
        ),
        (
            {"tenancy": {"auth": False}, "observability": {"metrics": {"port": 8000}}},
            "is the API's port",
        ),
        (
            {"tenancy": {"auth": True}, "observability": {"metrics": {"port": 9090}}},
            "no API keys",
        ),
    ],
)
def test_settings_that_contradict_themselves(data: dict[str, Any], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        check_settings(parse_settings(data))


def test_metrics_settings_default_to_the_api_port_behind_any_admin_key() -> None:
    metrics = Settings().observability.metrics
    assert (metrics.auth, metrics.port, metrics.host) == ("auto", None, None)
    check_settings(
        parse_settings(
            {
                "tenancy": {"admin_key_sha256": SHA},
                "observability": {"metrics": {"auth": "admin", "port": 9090}},
            }
        )
    )


@pytest.mark.parametrize(
    ("metrics", "admin_key", "auth", "behind"),
    [
        ({}, True, False, True),
        ({}, False, False, False),
        ({}, False, True, True),  # tenants' keys checked: their names are in the metrics
        ({"port": 9090}, False, True, True),
        ({"auth": "none"}, True, False, False),
        ({"auth": "none"}, False, True, False),
        ({"auth": "admin"}, True, False, True),
        ({"port": 9090}, True, False, True),
    ],
)
def test_the_metrics_sit_behind_the_admin_key_whenever_there_is_one(
    metrics: dict[str, Any], admin_key: bool, auth: bool, behind: bool
) -> None:
    tenancy: dict[str, Any] = {"auth": auth}
    if auth:
        tenancy |= {"tenants": [{"name": "t"}], "keys": [{"tenant": "t", "sha256": "ab" * 32}]}
    if admin_key:
        tenancy["admin_key_sha256"] = SHA
    settings = parse_settings({"tenancy": tenancy, "observability": {"metrics": metrics}})
    check_settings(settings)
    assert metrics_need_admin_key(settings) is behind
