"""Tenants, API keys and rate limits: who may call, which models they see, and how fast.

The request path uses ``service.Tenancy``: ``authenticate`` the caller, ``admit`` a plan (one
store round trip) and let the returned ticket settle what the request really used.
"""

from gateway.tenancy.config import KeyEntry, StoreSettings, TenancySettings, TenantPolicy

__all__ = ["KeyEntry", "StoreSettings", "TenancySettings", "TenantPolicy"]
