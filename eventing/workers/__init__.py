"""Where worker cores run: the worker core itself, Ray actors (the real runtime) or in-process (fast unit
tests) behind one executor interface, the kept Ray instance, and the data service for nodes without the
data directory (docs/architecture.md, 'Rooms and layers')."""
