"""Fair queueing of a model's requests when it is full: per-tenant queues, weighted shares of
tokens and priority classes, in front of the slot a request takes before it is dispatched."""
