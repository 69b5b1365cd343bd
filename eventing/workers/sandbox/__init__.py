"""Sandboxed workers (docs/guarantees.md, 'Sandboxed handlers'): the host's side (host.py: the child
started, its line, SandboxedCore and SandboxedRunner), the process children are forked from (zygote.py, the
host's end; zygote_process.py, the zygote's), the child process (child.py), their folders and environment
(folders.py), what the child does to itself before it runs anything (confine.py, with Landlock in
landlock.py and the system call filter in seccomp.py), the line between them (line.py) and what the child
may ask of the host (scope.py).

Nothing is imported here: the zygote loads this package before it forks."""
