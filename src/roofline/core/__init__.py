"""The core algebra: the ledger of einsums, sharding rules and meshes, collectives, the
sharded-einsum algebra, the stacks' option policies, pricing, and the walk that applies them
to every ledger row once. Everything else in roofline is a reader of the walk's records."""
