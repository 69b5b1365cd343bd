"""Sandboxed workers (docs/guarantees.md, 'Sandboxed handlers'): the host's side (host.py: the child
started, its line, SandboxedCore and SandboxedRunner), the child process (child.py, run as
``python -m eventing.workers.sandbox.child``), what it does to itself before it runs anything (confine.py,
with Landlock in landlock.py and the system call filter in seccomp.py), the line between them (line.py) and
what the child may ask of the host (scope.py).

Nothing is imported here: the child loads this package before it confines itself."""
