"""KV-cache scopes as pure logic: the salt a tenant's scope becomes, the engine's block names
under ``cache_salt_id``, the tensors the adapter sends for it, and the prefix router's hashes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from adapters.contract import GenerationRequest, InvalidRequest, ModelTarget, SamplingParams
from adapters.triton.config import parse_model_config
from adapters.triton.tensors import build_inputs
from deploy.triton.engine.blocks import BlockManager
from deploy.triton.engine.kvcache import KVLayout, KVPool
from deploy.triton.engine.kvstore import KVStore
from deploy.triton.engine.types import EngineRequest, LoraRequest
from deploy.triton.engine.wire import parse_items
from gateway.replicas.affinity import block_hashes
from gateway.replicas.pool import ReplicaPool
from gateway.replicas.settings import RoutingSettings
from gateway.replicas.sources import ReplicaAddress
from gateway.tenancy.config import PolicyError, TenancySettings, TenantPolicy, check_policy
from gateway.tenancy.service import Tenancy

BLOCK = 4
TARGET = ModelTarget(url="unused", triton_model="m_ensemble", kind="ensemble")
PROMPT = tuple(range(10, 27))  # four full blocks before the last token


def _store() -> KVStore:
    layout = KVLayout(((1, 2),), torch.float32)
    pool = KVPool(layout, num_blocks=32, tokens_per_block=BLOCK, device=torch.device("cpu"))
    return KVStore(pool, BlockManager(32, BLOCK, reuse=True), "model")


def _cached_then_reused(first: EngineRequest, second: EngineRequest) -> int:
    """Blocks ``second`` finds in the cache once ``first`` ran and left."""
    store = _store()
    admitted = store.admit(first, 2)
    assert admitted is not None and admitted.reused == 0
    store.grow(admitted.table, len(first.input_ids))
    admitted.table.length = len(first.input_ids)
    store.commit(admitted.table, first.input_ids, first.extra_ids)
    store.release(admitted.table)
    again = store.admit(second, 2)
    assert again is not None
    return again.reused


def _request(**fields: Any) -> EngineRequest:
    return EngineRequest(request_id="r", input_ids=PROMPT, max_new_tokens=2, **fields)


@pytest.mark.parametrize(
    ("first", "second", "reused"),
    [
        ({}, {}, 4),
        ({"cache_salt_id": 7}, {"cache_salt_id": 7}, 4),
        ({"cache_salt_id": 7}, {"cache_salt_id": 8}, 0),
        ({"cache_salt_id": 7}, {}, 0),
        ({"cache_salt_id": 0}, {}, 0),  # salt 0 is a salt, not "none"
        # A LoRA task and prompt-table ids keep salting inside one scope.
        (
            {"cache_salt_id": 7, "lora": LoraRequest(3)},
            {"cache_salt_id": 7, "lora": LoraRequest(3)},
            4,
        ),
        ({"cache_salt_id": 7, "lora": LoraRequest(3)}, {"cache_salt_id": 7}, 0),
        (
            {"cache_salt_id": 7, "lora": LoraRequest(3)},
            {"cache_salt_id": 8, "lora": LoraRequest(3)},
            0,
        ),
        (
            {"cache_salt_id": 7, "extra_ids": (0, 5, *(0,) * 15)},
            {"cache_salt_id": 7, "extra_ids": (0, 5, *(0,) * 15)},
            4,
        ),
        (
            {"cache_salt_id": 7, "extra_ids": (0, 5, *(0,) * 15)},
            {"cache_salt_id": 8, "extra_ids": (0, 5, *(0,) * 15)},
            0,
        ),
    ],
    ids=[
        "unsalted",
        "same-salt",
        "other-salt",
        "salt-then-none",
        "zero-salt",
        "same-scope-lora",
        "lora-then-base",
        "lora-other-scope",
        "same-scope-image",
        "image-other-scope",
    ],
)
def test_the_engine_reuses_blocks_only_under_the_same_salt(
    first: dict[str, Any], second: dict[str, Any], reused: int
) -> None:
    assert _cached_then_reused(_request(**first), _request(**second)) == reused


def test_the_engine_reads_cache_salt_id_per_item() -> None:
    inputs: dict[str, Any] = {
        "input_ids": np.array([[5, 6, 7], [8, 9, 0]], np.int32),
        "input_lengths": np.array([[3], [2]], np.int32),
        "request_output_len": np.array([[4], [2]], np.int32),
        "cache_salt_id": np.array([[2**64 - 1], [3]], np.uint64),
    }
    (first, _), (second, _) = parse_items(inputs, id_prefix="x", exclude_input_default=False)
    assert (first.cache_salt_id, second.cache_salt_id) == (2**64 - 1, 3)
    (alone, _), *_ = parse_items(
        {k: v[:1] for k, v in inputs.items() if k != "cache_salt_id"},
        id_prefix="y",
        exclude_input_default=False,
    )
    assert alone.cache_salt_id is None


def test_each_tenant_has_its_own_scope_and_a_named_scope_is_shared() -> None:
    a, b = TenantPolicy(name="team-a"), TenantPolicy(name="team-b")
    public_a = TenantPolicy(name="team-a", cache_scope="public")
    public_c = TenantPolicy(name="team-c", cache_scope="public")
    assert a.scope_salt != b.scope_salt
    assert public_a.scope_salt == public_c.scope_salt != a.scope_salt
    # A scope named after another tenant is not that tenant's own scope.
    assert TenantPolicy(name="x", cache_scope="team-a").scope_salt != a.scope_salt
    assert 0 <= a.scope_salt < 2**64


def test_a_client_cache_salt_narrows_its_scope_and_never_joins_another() -> None:
    a, b = TenantPolicy(name="team-a"), TenantPolicy(name="team-b")
    assert a.client_salt("mine") == a.client_salt("mine") != a.scope_salt
    assert a.client_salt("mine") != b.client_salt("mine")
    # Whatever b sends, its salts are its own scope's: not a's, with or without a's salt.
    guesses = ("", "team-a", "tenant\0team-a", str(a.scope_salt), "client")
    assert not {b.client_salt(g) for g in guesses} & {a.scope_salt, a.client_salt("mine")}


@pytest.mark.parametrize(
    ("auth", "shared", "client", "salted"),
    [
        (True, False, None, True),
        (True, True, None, False),  # the operator shares the model's cache
        (False, False, None, False),  # one caller: nothing to keep apart
        (False, False, "mine", True),  # a client salt is honoured everywhere
        (True, True, "mine", True),
    ],
)
def test_when_a_request_carries_a_salt(
    auth: bool, shared: bool, client: str | None, salted: bool
) -> None:
    tenant = TenantPolicy(name="team-a")
    tenancy = Tenancy(TenancySettings(auth=auth, tenants=(tenant,)))
    salt = tenancy.cache_salt(tenant, shared=shared, client=client)
    expected = tenant.scope_salt if client is None else tenant.client_salt(client)
    assert salt == (expected if salted else None)


@pytest.mark.parametrize("scope", ["no spaces/here", "public\n", "s" * 65, "-public"])
def test_a_cache_scope_name_is_checked_whole(scope: str) -> None:
    with pytest.raises(PolicyError) as raised:
        check_policy(TenantPolicy(name="t", cache_scope=scope))
    assert raised.value.field == "cache_scope"


def _config(salt_input: bool, reuse: str | None) -> dict[str, Any]:
    inputs = [
        {"name": "text_input", "data_type": "TYPE_STRING", "dims": [1]},
        {"name": "max_tokens", "data_type": "TYPE_INT32", "dims": [1]},
    ]
    if salt_input:
        inputs.append({"name": "cache_salt_id", "data_type": "TYPE_UINT64", "dims": [1]})
    parameters = {} if reuse is None else {"enable_kv_cache_reuse": {"string_value": reuse}}
    return {
        "name": "bls",
        "backend": "python",
        "max_batch_size": 64,
        "input": inputs,
        "parameters": {"tensorrt_llm_model_name": {"string_value": "engine"}, **parameters},
    }


def _sent(config: dict[str, Any], salt: int | None) -> dict[str, Any]:
    request = GenerationRequest(
        request_id="r",
        prompt="hi",
        params=SamplingParams(max_tokens=2),
        stream=False,
        cache_salt=salt,
    )
    return {t.name: t.array.tolist() for t in build_inputs(request, parse_model_config(config))}


def test_the_adapter_sends_the_salt_where_the_model_takes_it() -> None:
    assert _sent(_config(True, "true"), 2**64 - 1)["cache_salt_id"] == [[2**64 - 1]]
    assert "cache_salt_id" not in _sent(_config(True, "true"), None)


def test_a_model_that_cannot_salt_its_reused_cache_refuses_a_scoped_request() -> None:
    for reuse in ("true", None):  # unstated: the engine may reuse
        with pytest.raises(InvalidRequest, match="not configured to keep them apart") as caught:
            _sent(_config(False, reuse), 5)
        assert "declares no cache_salt_id" in caught.value.detail
    assert "cache_salt_id" not in _sent(_config(False, "false"), 5)  # no cache to share
    assert "cache_salt_id" not in _sent(_config(False, "true"), None)


def test_prefix_routing_keeps_scopes_apart() -> None:
    ids = list(range(64))
    assert block_hashes(ids, 16, 8, 1) == block_hashes(ids, 16, 8, 1)
    assert not set(block_hashes(ids, 16, 8, 1)) & set(block_hashes(ids, 16, 8, 2))
    assert not set(block_hashes(ids, 16, 8, 1)) & set(block_hashes(ids, 16, 8, None))


def test_a_replica_pool_finds_a_prefix_only_in_its_own_scope() -> None:
    pool = ReplicaPool("m", TARGET, RoutingSettings(prefix_block_tokens=4), retry_after_s=3)
    pool.update([ReplicaAddress(name, f"{name}:1", None) for name in ("a", "b")])
    for replica in pool.replicas.values():
        pool.probed(replica, True)

    def routed(salt: int | None) -> bool:
        request = GenerationRequest(
            request_id="r",
            prompt="p",
            params=SamplingParams(max_tokens=2),
            stream=True,
            prompt_ids=tuple(range(17)),
            cache_salt=salt,
        )
        return pool.pick(request).prefix_hit

    assert not routed(1)
    assert routed(1)  # the scope's own repeat goes where its blocks are
    assert not routed(2)  # another scope's copy is no prefix of this one
    assert not routed(None)


def test_a_client_salt_changes_only_the_lower_bits_of_its_scopes_salt() -> None:
    """The engine tells scopes apart by a salt's upper bits (its grammar compile slots), so
    no client salt can make a tenant a new owner there."""
    team_a = TenantPolicy(name="team-a")
    own = team_a.scope_salt
    for client in ("x", "y", "z" * 256):
        narrowed = team_a.client_salt(client)
        assert narrowed >> 32 == own >> 32 and narrowed != own
    assert TenantPolicy(name="team-b").scope_salt >> 32 != own >> 32
