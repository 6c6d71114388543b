"""Benchmarks of what a hostile tenant can do to the others: each module one kind of attack."""
