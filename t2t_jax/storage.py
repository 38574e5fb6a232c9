"""One path layer for everything a run directory holds: local paths and `gs://` URLs alike.

    workdir = storage.resolve(flag)                  # local: absolute; a URL: as given
    storage.write_atomic(storage.join(workdir, "results.json"), text)
    storage.append_line(storage.join(workdir, "history.jsonl"), json.dumps(event))

Local paths keep POSIX semantics (write-then-rename, fsync, O_EXCL). A URL goes through
`etils.epath` with `gcsfs` as its gs:// backend, the layer Orbax itself uses, so a bucket needs
no other client: a write is one object put (an object appears whole or not at all), an append
rewrites the object, a create-only write carries the generation precondition
`ifGenerationMatch=0`, and there are no directories (makedirs is a no-op, a "directory" is a
prefix). Listings drop gcsfs's cache first: Orbax's arrays are written by tensorstore, which
gcsfs does not see.

`STORAGE_EMULATOR_HOST=http://127.0.0.1:PORT` points every layer at a GCS emulator: gcsfs reads
it itself; this module derives tensorstore's endpoint (`TENSORSTORE_GCS_HTTP_URL`) and a dummy
token from it (Orbax's arrays) with at most 4 concurrent requests, and turns off gcsfs's
storage-control bucket probe (which an emulator does not serve). Variables already set are left
as they are.
"""

from __future__ import annotations

import builtins
import os
import posixpath
import shutil
import tempfile
from collections.abc import Iterable

os.environ.setdefault("EPATH_USE_TF", "false")  # epath's gs:// backend: gcsfs (fsspec), not tf.io.gfile


def _configure() -> None:
    """Point tensorstore (Orbax's arrays) and gcsfs at STORAGE_EMULATOR_HOST when it is set."""
    emulator = os.environ.get("STORAGE_EMULATOR_HOST", "")
    if emulator and emulator != "default":
        url = emulator if "://" in emulator else "http://" + emulator
        os.environ.setdefault("TENSORSTORE_GCS_HTTP_URL", url)
        os.environ.setdefault("GOOGLE_AUTH_TOKEN_FOR_TESTING", "emulator")  # (no credential lookup)
        os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")  # (read when gcsfs is imported)
        # An emulator such as gcp-storage-emulator serves one request at a time from a listen backlog
        # of 5: more concurrent connections than that can be reset under load.
        os.environ.setdefault("TENSORSTORE_GCS_REQUEST_CONCURRENCY", "4")


_configure()


def is_url(path) -> bool:
    """True for `scheme://...` (object storage), False for a local path."""
    return "://" in os.fspath(path)


def resolve(path) -> str:
    """A local path made absolute; a URL as given (without a trailing slash)."""
    path = os.fspath(path)
    return path.rstrip("/") if is_url(path) else os.path.abspath(path)


def join(path, *names: str) -> str:
    """`path/name/...` (os.path.join locally, '/' for a URL)."""
    path = os.fspath(path)
    return posixpath.join(path, *names) if is_url(path) else os.path.join(path, *names)


def dirname(path) -> str:
    path = os.fspath(path)
    return posixpath.dirname(path.rstrip("/")) if is_url(path) else os.path.dirname(path)


def _epath(path):
    _configure()
    from etils import epath

    return epath.Path(os.fspath(path))


def _fs(path):
    """The fsspec filesystem of a URL: epath's own instance (one cache shared with Orbax), its
    listing cache dropped (objects written by tensorstore or another process are seen)."""
    p = _epath(path)
    backend = getattr(p, "_backend", None)
    if hasattr(backend, "fs"):
        fs = backend.fs(os.fspath(p))
    else:  # (an epath without the fsspec backend's seam)
        import fsspec

        fs = fsspec.core.url_to_fs(os.fspath(path))[0]
    fs.invalidate_cache()
    return fs


def exists(path) -> bool:
    """A file or a directory (a URL: an object or a non-empty prefix)."""
    return _fs(path).exists(os.fspath(path)) if is_url(path) else os.path.exists(path)


def isdir(path) -> bool:
    """A local directory; a URL prefix holding objects."""
    return _fs(path).isdir(os.fspath(path)) if is_url(path) else os.path.isdir(path)


def listdir(path) -> list[str]:
    """The names directly under `path`, sorted (FileNotFoundError when there is nothing)."""
    if not is_url(path):
        return sorted(os.listdir(path))
    fs = _fs(path)
    if not fs.isdir(os.fspath(path)):
        raise FileNotFoundError(f"{path}: no such directory")
    own = fs._strip_protocol(os.fspath(path)).rstrip("/")
    entries = [p.rstrip("/") for p in fs.ls(os.fspath(path), detail=False)]
    return sorted(posixpath.basename(p) for p in entries if p and p != own)  # (not a "dir/" placeholder)


def walk_files(path) -> list[str]:
    """The relative paths ('/'-separated) of every file below `path`, sorted."""
    path = os.fspath(path)
    if not is_url(path):
        out = []
        for root, _, files in os.walk(path):
            out += [os.path.relpath(os.path.join(root, f), path).replace(os.sep, "/") for f in files]
        return sorted(out)
    fs = _fs(path)
    base = fs._strip_protocol(path).rstrip("/") + "/"
    return sorted(p[len(base) :] for p in fs.find(path) if p.startswith(base))


def makedirs(path) -> None:
    """A local directory and its parents (exist_ok); nothing for a URL (no directories there)."""
    if not is_url(path):
        os.makedirs(path, exist_ok=True)


def open(path, mode: str = "r"):  # noqa: A001 (the module's own `open`, as os.open)
    """A file object on `path` ('r', 'rb', 'w', 'wb'; a URL's write is one object put at close)."""
    return _epath(path).open(mode) if is_url(path) else builtins.open(path, mode)


def read_text(path) -> str:
    with open(path) as f:
        return f.read()


def read_bytes(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def write_atomic(path, data: str | bytes | Iterable[str]) -> None:
    """Write `data` (text, bytes, or text chunks, streamed) so that nothing half-written is left:
    locally a temporary file beside `path`, synced, then renamed; a URL gets one object put of
    the whole (spooled to a local temporary file first: a failing generator writes nothing)."""
    path = os.fspath(path)
    mode = "wb" if isinstance(data, bytes) else "w"
    chunks = [data] if isinstance(data, (str, bytes)) else data
    if is_url(path):
        with tempfile.TemporaryDirectory(prefix="t2t_put_") as tmp:
            local = os.path.join(tmp, "data")
            with builtins.open(local, mode) as f:
                f.writelines(chunks)
            _fs(path).put_file(local, path)
        return
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), suffix=".tmp")
    try:
        with os.fdopen(fd, mode) as f:
            f.writelines(chunks)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def create_exclusive(path, text: str) -> None:
    """Create `path` holding `text` only if nothing is there: FileExistsError otherwise (locally
    O_CREAT|O_EXCL; a URL: one put with the precondition ifGenerationMatch=0, which GCS answers
    with 412 -> FileExistsError when the object exists)."""
    path = os.fspath(path)
    if is_url(path):
        fs = _fs(path)
        if fs.exists(path):  # (also for stores that ignore preconditions, such as emulators)
            raise FileExistsError(path)
        fs.pipe_file(path, text.encode(), mode="create")
        return
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def append_line(path, line: str) -> None:
    """One line appended (a newline added): locally appended and synced; a URL's object is read
    and rewritten whole (GCS objects cannot be appended to; one writer per run directory)."""
    line = line.rstrip("\n") + "\n"
    if is_url(path):
        old = read_text(path) if exists(path) else ""
        write_atomic(path, old + ("" if not old or old.endswith("\n") else "\n") + line)
        return
    with builtins.open(path, "a") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())


def upload(local_path: str, path) -> None:
    """A local file copied to `path` whole (a URL: one object put; locally write-then-rename)."""
    if is_url(path):
        _fs(path).put_file(local_path, os.fspath(path))
    else:
        with builtins.open(local_path, "rb") as f:
            write_atomic(path, f.read())


def remove(path) -> None:
    """A file, or an empty local directory (a URL "directory" vanishes with its last object)."""
    if is_url(path):
        fs = _fs(path)
        if fs.isfile(os.fspath(path)):
            fs.rm_file(os.fspath(path))
    elif os.path.isdir(path) and not os.path.islink(path):
        os.rmdir(path)
    else:
        os.remove(path)


def remove_tree(path) -> None:
    """A file or a directory with everything below it; nothing when absent."""
    if is_url(path):
        fs = _fs(path)
        if fs.exists(os.fspath(path)):
            fs.rm(os.fspath(path), recursive=True)
    elif os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)


def move(src, dst) -> None:
    """A file or directory moved to `dst` (its parent made as needed). Locally a rename; a URL's
    objects are copied one by one, then the source removed (GCS has no rename)."""
    if is_url(src) != is_url(dst):
        raise ValueError(f"move: {src} and {dst} must both be local or both URLs")
    if not is_url(src):
        os.makedirs(os.path.dirname(os.path.abspath(dst)), exist_ok=True)
        shutil.move(src, dst)
        return
    fs = _fs(src)
    src, dst = os.fspath(src).rstrip("/"), os.fspath(dst).rstrip("/")
    if fs.isfile(src):
        fs.copy(src, dst)
    else:
        for rel in walk_files(src):
            fs.copy(join(src, rel), join(dst, rel))
    fs.rm(src, recursive=True)
