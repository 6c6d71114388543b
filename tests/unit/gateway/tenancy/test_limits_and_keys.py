"""Pure parts of tenancy: the rate algorithm, keys, headers, policies and reservations."""

from __future__ import annotations

import re
from typing import Any

import msgspec
import pytest

from adapters.contract import BeamSearch, SamplingParams
from gateway.core.plan import ChoiceSpec, Plan, Prompt
from gateway.errors import AuthenticationError
from gateway.tenancy.admission import reservation
from gateway.tenancy.config import (
    KeyEntry,
    PolicyError,
    TenancyConfigError,
    TenancySettings,
    TenantPolicy,
    check_key,
    check_policy,
    check_tenancy,
)
from gateway.tenancy.quota import (
    HEADROOM,
    Decision,
    Limit,
    Limits,
    Quota,
    duration,
    far_from_limits,
    give_back,
    rate_limit_headers,
    take,
)
from gateway.tenancy.service import (
    MalformedKey,
    Tenancy,
    credentials_headers,
    digest,
    matches,
    new_key,
    presented_key,
)

PER_SECOND = Limit("requests", rate=60, period=60, capacity=3)  # one a second, three at once


def test_a_full_bucket_admits_its_capacity_then_one_per_interval() -> None:
    tat, admitted = 0.0, []
    for now in [100.0, 100.0, 100.0, 100.0, 100.5, 101.0, 101.0]:
        decision = take(PER_SECOND, tat, now, 1)
        admitted.append(decision.allowed)
        tat = decision.tat
    assert admitted == [True, True, True, False, False, True, False]


def test_denials_say_when_to_retry_and_what_is_left() -> None:
    tat = 0.0
    for _ in range(3):
        tat = take(PER_SECOND, tat, 10.0, 1).tat
    denied = take(PER_SECOND, tat, 10.25, 1)
    assert not denied.allowed and denied.tat == tat
    assert denied.retry_after == pytest.approx(0.75)
    assert denied.remaining == pytest.approx(0.25)
    assert denied.reset_after == pytest.approx(2.75)
    assert take(PER_SECOND, tat, 10.25 + denied.retry_after, 1).allowed


def test_no_burst_beyond_capacity_and_no_more_than_rate_over_time() -> None:
    """Offered ten a second for a minute: admitted = capacity + one a second, never twice."""
    tat, admitted = 0.0, 0
    for step in range(600):
        decision = take(PER_SECOND, tat, 1000 + step / 10, 1)
        if decision.allowed:
            admitted += 1
            tat = decision.tat
    assert admitted == 3 + 59


@pytest.mark.parametrize(
    ("cost", "allowed"), [(3, True), (4, False)], ids=["fits", "more-than-capacity"]
)
def test_costs_take_several_units(cost: float, allowed: bool) -> None:
    assert take(PER_SECOND, 0.0, 50.0, cost).allowed is allowed


def test_giving_back_refills_but_never_beyond_full() -> None:
    tat = take(PER_SECOND, 0.0, 10.0, 3).tat
    assert give_back(PER_SECOND, tat, 10.0, 2) == pytest.approx(11.0)
    assert give_back(PER_SECOND, tat, 10.0, 10) == 10.0
    assert give_back(PER_SECOND, tat, 10.0, -1) == pytest.approx(14.0)


def test_limits_of_a_policy() -> None:
    limits = Limits.of(
        TenantPolicy(
            name="t",
            requests_per_minute=120,
            tokens_per_minute=6000,
            tokens_per_day=100_000,
            max_concurrency=4,
            burst=0.5,
        )
    )
    assert limits.requests == Limit("requests", 120, 60, 60)
    assert limits.tokens == Limit("tokens", 6000, 60, 3000)
    assert limits.daily_tokens == Limit("tokens_per_day", 100_000, 86400, 100_000)
    assert limits.concurrency == 4
    assert limits.largest_reservation() == 3000
    assert Limits.of(TenantPolicy(name="free")).largest_reservation() is None


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.0004, "1ms"), (0.02, "20ms"), (1.5, "1.5s"), (59.9994, "59.999s"), (360, "6m0s"),
     (3725.25, "1h2m5.25s")],
)  # fmt: skip
def test_reset_durations_as_openai_writes_them(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def test_rate_limit_headers() -> None:
    requests = Limit("requests", 60, 60, 60)
    tokens = Limit("tokens", 1000, 60, 1000)
    quota = Quota(
        requests=(requests, Decision(True, 0, 0, 58.99, 2.0)),
        tokens=(tokens, Decision(True, 0, 0, 750.5, 15.03)),
    )
    assert rate_limit_headers(quota) == {
        "x-ratelimit-limit-requests": "60",
        "x-ratelimit-remaining-requests": "58",
        "x-ratelimit-reset-requests": "2s",
        "x-ratelimit-limit-tokens": "1000",
        "x-ratelimit-remaining-tokens": "750",
        "x-ratelimit-reset-tokens": "15.03s",
    }
    assert rate_limit_headers(Quota()) == {}
    assert rate_limit_headers(None) == {}


def _left(limits: Limits, requests: float, tokens: float) -> Quota:
    """An answer that left ``requests`` and ``tokens`` in the limits' buckets."""
    token_limit = limits.tokens or limits.daily_tokens

    def entry(limit: Limit | None, remaining: float) -> tuple[Limit, Decision] | None:
        return None if limit is None else (limit, Decision(True, 0.0, 0.0, remaining, 1.0))

    return Quota(requests=entry(limits.requests, requests), tokens=entry(token_limit, tokens))


def test_a_request_is_expected_to_be_admitted_only_far_from_every_limit() -> None:
    policy = TenantPolicy(name="t", requests_per_minute=100, tokens_per_minute=10_000, burst=1.0)
    limits = Limits.of(policy)
    far = _left(limits, 90, 9_000)
    assert far_from_limits(limits, far, 1_000)
    # After the request, each bucket must still hold HEADROOM of its capacity.
    room = 9_000 - HEADROOM * 10_000
    assert far_from_limits(limits, far, int(room))
    assert not far_from_limits(limits, far, int(room) + 1)
    assert not far_from_limits(limits, _left(limits, HEADROOM * 100, 9_000), 1)
    # Nothing known yet: the first request of a tenant waits for its answer.
    assert not far_from_limits(limits, None, 1)


def test_limits_the_answer_does_not_show_are_never_expected_to_admit() -> None:
    concurrency = Limits.of(TenantPolicy(name="c", tokens_per_minute=10_000, max_concurrency=50))
    assert not far_from_limits(concurrency, _left(concurrency, 0, 10_000), 1)
    both = Limits.of(TenantPolicy(name="d", tokens_per_minute=10_000, tokens_per_day=10**6))
    assert not far_from_limits(both, _left(both, 0, 10_000), 1)
    daily = Limits.of(TenantPolicy(name="e", tokens_per_day=10**6))
    assert far_from_limits(daily, _left(daily, 0, 10**6), 1)
    unlimited = Limits.of(TenantPolicy(name="u"))
    assert far_from_limits(unlimited, Quota(), 10**9)


def test_an_answer_under_other_limits_is_not_trusted() -> None:
    """An admin edit since the answer (a limit added, removed or changed) waits for a new one."""
    before = Limits.of(TenantPolicy(name="t", tokens_per_minute=10_000, burst=1.0))
    known = _left(before, 0, 10_000)
    assert far_from_limits(before, known, 1)
    tighter = Limits.of(TenantPolicy(name="t", tokens_per_minute=5_000, burst=1.0))
    assert not far_from_limits(tighter, known, 1)
    added = Limits.of(TenantPolicy(name="t", requests_per_minute=10, tokens_per_minute=10_000))
    assert not far_from_limits(added, known, 1)
    removed = Limits.of(TenantPolicy(name="t"))
    assert not far_from_limits(removed, known, 1)


def test_keys_are_random_and_stored_as_digests() -> None:
    key = new_key()
    assert re.fullmatch(r"tgw-[A-Za-z0-9_-]{43}", key)
    assert key != new_key()
    assert digest(key) == digest(key) and len(digest(key)) == 64
    assert matches(key, digest(key)) and not matches(key, None) and not matches("x", digest(key))


@pytest.mark.parametrize(
    ("headers", "key"),
    [
        ({}, None),
        ({"authorization": "Bearer abc"}, "abc"),
        ({"authorization": "bearer  abc "}, "abc"),
        ({"api-key": "abc"}, "abc"),
        ({"authorization": "Bearer abc", "api-key": "zzz"}, "abc"),
    ],
)
def test_presented_key(headers: dict[str, str], key: str | None) -> None:
    assert presented_key(headers) == key


@pytest.mark.parametrize(
    "headers",
    [
        {"authorization": "Basic dXNlcjpwYXNz"},
        {"authorization": "Bearer"},
        {"authorization": "Bearer a b"},
        {"api-key": ""},
        {"api-key": "x" * 300},
        {"api-key": "bad\x00key"},
    ],
)
def test_malformed_credentials(headers: dict[str, str]) -> None:
    with pytest.raises(MalformedKey):
        presented_key(headers)


SHA = "a" * 64


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({}, "auth is on but no API keys"),
        ({"tenants": [{"name": "a"}, {"name": "a"}], "keys": [{"tenant": "a", "sha256": SHA}]},
         "appear twice"),
        ({"tenants": [{"name": "a"}], "keys": [{"tenant": "b", "sha256": SHA}]}, "unknown tenant"),
        ({"tenants": [{"name": "a"}], "keys": [{"tenant": "a", "sha256": "xyz"}]}, "64 hex"),
        ({"tenants": [{"name": "a", "burst": 0}], "admin_key_sha256": SHA}, "burst"),
        ({"tenants": [{"name": "a", "tokens_per_minute": 0}], "admin_key_sha256": SHA},
         "at least 1"),
        ({"tenants": [{"name": "a b"}], "admin_key_sha256": SHA}, "must match"),
        ({"tenants": [{"name": "a"}], "keys": [{"tenant": "a", "sha256": SHA}],
          "admin_key_sha256": SHA}, "admin key must not"),
    ],
)  # fmt: skip
def test_tenancy_settings_that_cannot_work(settings: dict[str, Any], message: str) -> None:
    import msgspec

    with pytest.raises(TenancyConfigError, match=message):
        check_tenancy(msgspec.convert(settings, TenancySettings))


@pytest.mark.parametrize(
    ("policy", "field"),
    [
        (TenantPolicy(name="team-b\n"), "name"),
        (TenantPolicy(name="team-b\r"), "name"),
        (TenantPolicy(name="x" * 65), "name"),
        (TenantPolicy(name="a", priority=-5), "priority"),
        (TenantPolicy(name="a", priority=10**6), "priority"),
    ],
)
def test_policies_are_matched_whole_and_bounded(policy: TenantPolicy, field: str) -> None:
    with pytest.raises(PolicyError) as caught:
        check_policy(policy)
    assert caught.value.field == field


@pytest.mark.parametrize(
    ("key", "field"),
    [
        (KeyEntry(tenant="a", sha256=SHA, name="n" * 129), "name"),
        (KeyEntry(tenant="a", sha256=SHA, name="ci\nkey"), "name"),
        (KeyEntry(tenant="a\n", sha256=SHA), "tenant"),
        (KeyEntry(tenant="a", sha256=SHA + "\n"), "sha256"),
    ],
)
def test_key_entries_are_matched_whole_and_bounded(key: KeyEntry, field: str) -> None:
    with pytest.raises(PolicyError) as caught:
        check_key(key)
    assert caught.value.field == field


def test_the_bounds_themselves_are_accepted() -> None:
    check_policy(TenantPolicy(name="a" * 64, priority=100))
    check_policy(TenantPolicy(name="a", priority=0))
    check_key(KeyEntry(tenant="a", sha256=SHA, name="n" * 128))


def test_the_admin_key_on_the_api_says_it_is_the_admin_key() -> None:
    admin, tenant = new_key(), new_key()
    tenancy = Tenancy(
        TenancySettings(
            tenants=(TenantPolicy(name="a"),),
            keys=(KeyEntry(tenant="a", sha256=digest(tenant)),),
            admin_key_sha256=digest(admin),
        )
    )
    assert tenancy.authenticate({"authorization": f"Bearer {tenant}"}).name == "a"
    with pytest.raises(AuthenticationError) as caught:
        tenancy.authenticate({"authorization": f"Bearer {admin}"})
    assert "admin key" in caught.value.message and "/admin/" in caught.value.message
    with pytest.raises(AuthenticationError, match="Incorrect API key provided"):
        tenancy.authenticate({"authorization": f"Bearer {new_key()}"})


def test_auth_off_or_an_admin_key_alone_are_valid() -> None:
    check_tenancy(TenancySettings(auth=False))
    check_tenancy(TenancySettings(admin_key_sha256=SHA))


@pytest.mark.parametrize(
    ("patterns", "name", "allowed"),
    [(("*",), "x", True), (("llama-*",), "llama-8b", True), (("llama-*",), "qwen", False),
     ((), "x", False)],
)  # fmt: skip
def test_model_patterns(patterns: tuple[str, ...], name: str, allowed: bool) -> None:
    assert TenantPolicy(name="t", models=patterns).allows_model(name) is allowed


def test_reservation_counts_each_prompt_once_and_every_choice() -> None:
    def choice(index: int, prompt_index: int, tokens: int, max_tokens: int) -> ChoiceSpec:
        return ChoiceSpec(
            index, prompt_index, Prompt("p", tokens), SamplingParams(max_tokens=max_tokens)
        )

    plan = Plan(
        model="m",
        choices=(choice(0, 0, 10, 5), choice(1, 0, 10, 5), choice(2, 1, 7, 20)),
        stream=False,
        include_usage=False,
    )
    assert reservation(plan) == 10 + 7 + 5 + 5 + 20


def test_a_beam_search_reserves_every_beam_of_each_prompt() -> None:
    beam = BeamSearch(width=4, param="best_of")

    def choice(index: int, prompt_index: int, tokens: int) -> ChoiceSpec:
        params = SamplingParams(max_tokens=6, beam=beam)
        return ChoiceSpec(index, prompt_index, Prompt("p", tokens), params)

    plan = Plan(
        model="m",
        choices=(choice(0, 0, 10), choice(1, 0, 10), choice(2, 1, 7), choice(3, 1, 7)),
        stream=False,
        include_usage=False,
    )
    assert reservation(plan) == 10 + 7 + 2 * 4 * 6


def test_credentials_headers_are_the_first_of_each_name_presented_key_reads() -> None:
    raw = [
        (b"content-type", b"application/json"),
        (b"Authorization", b"Bearer tgw-one"),
        (b"authorization", b"Bearer tgw-two"),
        (b"api-key", b"azure-key"),
    ]
    found = credentials_headers(raw)
    assert found == {"authorization": "Bearer tgw-one", "api-key": "azure-key"}
    assert presented_key(found) == "tgw-one"
    assert presented_key(credentials_headers(raw[3:])) == "azure-key"
    assert credentials_headers([]) == {}


@pytest.mark.parametrize(
    ("patterns", "every", "names"),
    [(("*",), True, set()), (("llama-8b", "qwen-*"), False, {"llama-8b"}),
     (("a?", "[ab]c", "plain"), False, {"plain"}), ((), False, set())],
)  # fmt: skip
def test_what_a_request_reads_of_a_policy_is_derived_once(
    patterns: tuple[str, ...], every: bool, names: set[str]
) -> None:
    tenant = TenantPolicy(name="t", models=patterns)
    assert (tenant.every_model, tenant.model_names) == (every, names)
    assert tenant.scope_salt is tenant.scope_salt  # derived once, then read
    # Kept beside the fields, never encoded with them.
    assert set(msgspec.json.decode(msgspec.json.encode(tenant))) == set(tenant.__struct_fields__)
    # A policy changed at run time is a new object: its values are derived afresh.
    renamed = msgspec.structs.replace(tenant, name="u", models=("*",))
    assert renamed.every_model and renamed.scope_salt != tenant.scope_salt
