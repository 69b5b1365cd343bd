"""Handler execution: loading a handler, running one call with its bindings, curl, timers and log, and
holding its effects until the worker commits them (docs/architecture.md, 'Rooms and layers')."""
