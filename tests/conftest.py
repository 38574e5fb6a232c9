"""Shared test helpers: hypothesis profile, small board factories, a free port, and a GCS
emulator (`emulator`: `gcp-storage-emulator` on 127.0.0.1 with STORAGE_EMULATOR_HOST pointing
every layer, gcsfs and tensorstore under Orbax, at it; the bucket BUCKET made).

The emulator is started with two fixes that make it answer as GCS does (`PATCH` below; also a
listen backlog of 1,024 connections instead of 5, so none is reset under load): a
download, by the download URL or the JSON API's `?alt=media` (the one tensorstore uses), carries
the object's generation (`x-goog-generation`) and honours `ifGenerationMatch` (412) and
`ifGenerationNotMatch` (304): without them tensorstore's conditional re-read of an OCDBT
manifest leaves it without a generation and its next conditional write fails with "Malformed
StorageGeneration" (1 save in 10 under load; every whole 2-host run); and an upload honours
`ifGenerationMatch` (412 when it does not match: the create-only write of the run directory's
lock)."""

import functools
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

# Tests that Ctrl-C a child expect what a terminal gives it: pytest started in the background by a
# non-interactive shell (`pytest ... &`, nohup, CI scripts) has SIGINT and SIGQUIT ignored (POSIX:
# no job control), every child inherits that (SigIgn 0x1001006 in /proc/self/status), and an
# ignored Ctrl-C never reaches the program under test. A Python handler here (in every xdist
# worker too) gives each exec'd child SIGINT's default action again.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

settings.register_profile(
    "default", deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
settings.register_profile(
    "ci", deadline=None, max_examples=400, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


# The longest files first (pyproject.toml: --no-loadscope-reorder keeps this order): with -n 2 and
# --dist loadfile, a long file dealt last runs alone on one worker while the other idles.
FIRST = ("test_pod.py", "test_stages.py", "test_learning.py", "test_cli_mapf.py", "test_trainer.py", "test_aot.py")


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: FIRST.index(item.path.name) if item.path.name in FIRST else len(FIRST))


def make_board(size, holes=(), starts=(), goals=(), optimal_makespan=None):
    """An interchange dict (see t2t_jax.env.io)."""
    board = {
        "size": size,
        "holes": [list(h) for h in holes],
        "starts": [list(s) for s in starts],
        "goals": [list(g) for g in goals],
    }
    if optimal_makespan is not None:
        board["optimal_makespan"] = optimal_makespan
    return board


def free_cells(board):
    holes = {tuple(h) for h in board["holes"]}
    n = board["size"]
    return [(r, c) for r in range(n) for c in range(n) if (r, c) not in holes]


def as_numpy(tree):
    return {k: np.asarray(v) for k, v in tree.items()}


@functools.cache
def generator(config, candidates=8):
    """One compiled Generator per (config, candidates) for the whole session."""
    from t2t_jax.env.generator import Generator

    return Generator(config, candidates=candidates)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (servers, coordinators and emulators of the tests)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


BUCKET = "t2t-test"
EMULATOR_VARS = (
    "STORAGE_EMULATOR_HOST",
    "TENSORSTORE_GCS_HTTP_URL",
    "GOOGLE_AUTH_TOKEN_FOR_TESTING",
    "TENSORSTORE_GCS_REQUEST_CONCURRENCY",
)


# Run as `python -c PATCH start --host=... --port=... ...`: the emulator's CLI with the two fixes.
PATCH = """
import http.server
import sys
from http import HTTPStatus

from gcp_storage_emulator import server
from gcp_storage_emulator.__main__ import main
from gcp_storage_emulator.handlers import objects

_download, _insert = objects.download, objects.insert


def _obj(storage, bucket, name):
    try:
        return storage.get_file_obj(bucket, name)
    except Exception:
        return None


def download(request, response, storage, *args, **kwargs):
    obj = _obj(storage, request.params["bucket_name"], request.params["object_id"])
    have = str(obj["generation"]) if obj is not None else None
    match, not_match = (request.query.get(k, [None])[0] for k in ("ifGenerationMatch", "ifGenerationNotMatch"))
    if have is not None and match is not None and match != have:
        response.status = HTTPStatus.PRECONDITION_FAILED
        return None
    if have is not None and not_match is not None and not_match == have:
        response.status = HTTPStatus.NOT_MODIFIED
        response["x-goog-generation"] = have
        return None
    _download(request, response, storage, *args, **kwargs)
    if have is not None and response.status in (HTTPStatus.OK, HTTPStatus.PARTIAL_CONTENT):
        response["x-goog-generation"] = have
        response["x-goog-metageneration"] = str(obj.get("metageneration", "1"))


def insert(request, response, storage, *args, **kwargs):
    want = request.query.get("ifGenerationMatch")
    if want:
        name = request.query.get("name", [None])[0]
        if name is None and request.query.get("uploadType", [""])[0] == "multipart":
            name = request.data["meta"].get("name")
        obj = _obj(storage, request.params["bucket_name"], name) if name else None
        if str(obj["generation"] if obj is not None else "0") != want[0]:
            response.status = HTTPStatus.PRECONDITION_FAILED
            response.json({"error": {"code": 412, "message": "Precondition Failed"}})
            return None
    return _insert(request, response, storage, *args, **kwargs)


# A backlog of 1,024 connections, not socketserver's 5: the emulator serves one request at a time,
# and under load the connections past its backlog were reset (a client's retried write then met
# the first attempt's object).
http.server.HTTPServer.request_queue_size = 1024
swap = {_download: download, _insert: insert}
objects.download = download  # (the JSON API's GET ...?alt=media calls it by name)
server.HANDLERS = tuple((rx, {m: swap.get(h, h) for m, h in hs.items()}) for rx, hs in server.HANDLERS)
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    """The emulator's URL, with the bucket made; STORAGE_EMULATOR_HOST set for the module's tests."""
    if importlib.util.find_spec("gcp_storage_emulator") is None:
        pytest.fail("gcp-storage-emulator is not installed: pip install -e .[test]")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(tmp_path_factory.mktemp("emulator") / "log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-c", PATCH, "start", "--host=127.0.0.1", f"--port={port}", f"--default-bucket={BUCKET}"]
        + ["--in-memory"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    saved = {k: os.environ.get(k) for k in EMULATOR_VARS}
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/storage/v1/b/{BUCKET}", timeout=1).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"the GCS emulator did not start (exit {proc.poll()}); see {log.name}")
                time.sleep(0.2)
        os.environ["STORAGE_EMULATOR_HOST"] = url
        for k in EMULATOR_VARS[1:]:  # (derived from STORAGE_EMULATOR_HOST by storage.py)
            os.environ.pop(k, None)
        from t2t_jax import storage

        storage._configure()
        yield url
    finally:
        proc.kill()
        proc.wait()
        log.close()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
