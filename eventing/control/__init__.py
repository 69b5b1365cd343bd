"""The control plane: function lifecycle, the service that runs deployed functions, their supervisors,
nodes and rebalance plans, failover and leadership (docs/architecture.md, 'Rooms and layers')."""
