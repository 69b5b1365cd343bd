"""The folders of sandboxed children, under the system temporary folder: one private folder each (its TMPDIR
and HOME, with links to the project's packages as its import path), with a lock its host holds while it
lives (`sweep_sandboxes` removes those whose host has ended), and the environment a child starts with."""

from __future__ import annotations

import os
import time

_SANDBOXES = "eventing-sandboxes"  # under the system temporary folder: one private folder per sandbox
_CODE = ".eventing-code"  # in a sandbox's folder: links to the project's packages, the child's import path


def sandboxes_root() -> str:
    import tempfile

    root = os.path.join(tempfile.gettempdir(), _SANDBOXES)
    os.makedirs(root, mode=0o700, exist_ok=True)
    return root


ORPHAN_AGE_S = 3600  # a sandbox folder without a lock file this old has no host (see sweep_sandboxes)


def sweep_sandboxes() -> int:
    """Remove the private folders of sandboxes whose host has ended without removing them (a worker killed
    with kill -9, or by Ray at the end of a run): a folder's host holds a lock on ``<folder>.lock`` while it
    lives, and the kernel lets it go when the host ends, however it ends. Returns how many were removed."""
    import fcntl
    import shutil

    root, removed = sandboxes_root(), 0
    for entry in os.scandir(root):
        if not entry.name.endswith(".lock"):
            continue
        try:
            fd = os.open(entry.path, os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            continue  # removed meanwhile by another sweep
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # its host is alive
        try:
            shutil.rmtree(entry.path[: -len(".lock")], ignore_errors=True)
            os.unlink(entry.path)
            removed += 1
        except OSError:
            pass
        finally:
            os.close(fd)
    # A folder whose host never made its lock (killed in the moment between the two, or an older version
    # that made none) and that nothing has changed for ORPHAN_AGE_S.
    old = time.time() - ORPHAN_AGE_S
    for entry in os.scandir(root):
        try:
            if (
                entry.is_dir(follow_symlinks=False)
                and not os.path.exists(entry.path + ".lock")
                and entry.stat(follow_symlinks=False).st_mtime < old
            ):
                shutil.rmtree(entry.path, ignore_errors=True)
                removed += 1
        except OSError:
            pass
    return removed


def project_packages() -> tuple[str, list[str]]:
    """The folder holding the project's packages (a checkout, site-packages, or a folder Ray unpacked them
    into) and the packages' folders."""
    import eventing
    from eventing.core.names import PROJECT_PACKAGES

    root = os.path.dirname(os.path.dirname(os.path.abspath(eventing.__file__)))
    return root, [
        os.path.join(root, name) for name in PROJECT_PACKAGES if os.path.isdir(os.path.join(root, name))
    ]


def claim_folder(prefix: str) -> tuple[str, int]:
    """A new private folder under sandboxes_root() and the descriptor of its lock, held while it is in use
    (sweep_sandboxes); locked before a sweep can see it under its name."""
    import fcntl
    import tempfile

    try:
        sweep_sandboxes()
    except OSError:
        pass  # another sweep's business
    folder = tempfile.mkdtemp(prefix=prefix, dir=sandboxes_root())
    lock = os.open(folder + ".lock-new", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)
    os.rename(folder + ".lock-new", folder + ".lock")
    return folder, lock


def package_view(folder: str, packages: list[str]) -> str:
    """A folder in `folder` of links to the project's packages: a sandboxed process's import path, which
    shows none of a checkout's other files."""
    view = os.path.join(folder, _CODE)
    os.mkdir(view)
    for package in packages:
        os.symlink(package, os.path.join(view, os.path.basename(package)))
    return view


def sandbox_env(first_path: str, root: str) -> dict[str, str]:
    """The environment every sandboxed process starts with: no store credentials, `first_path` on its
    import path instead of the checkout `root`, and OpenBLAS without threads (the zygote,
    eventing.workers.sandbox.zygote, imports numpy before it forks)."""
    env = {name: os.environ[name] for name in ("PATH", "LANG", "LC_ALL") if name in os.environ}
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    env["PYTHONPATH"] = os.pathsep.join([first_path, *(p for p in paths if p and os.path.abspath(p) != root)])
    env.update({"PYTHONDONTWRITEBYTECODE": "1", "OPENBLAS_NUM_THREADS": "1"})
    return env


def child_env(folder: str, view: str, root: str) -> dict[str, str]:
    """A sandboxed child's whole environment: `sandbox_env` with `view` first on its import path, and
    `folder` as its TMPDIR and HOME."""
    return {**sandbox_env(view, root), "TMPDIR": folder, "HOME": folder}
