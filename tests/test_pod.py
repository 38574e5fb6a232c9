"""The pod path as pods run it (slow): `configs/qwen3_4b.py:rehearsal` (every code path of the paper
config with the tiny model) as two processes x 4 CPU devices over localhost (jax.distributed,
gloo) with the run directory on a bucket (`gs://`, the GCS emulator of tests/conftest.py
`emulator`, started by the test on 127.0.0.1), SIGTERM to one host in the middle of stage 0,
`--resume` on both; the records equal an uninterrupted single-process run on 8 devices (its run
directory local). Then a second start without `--resume` is refused on both hosts at once."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import BUCKET, free_port

from t2t_jax import storage

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOSTS, DEVICES = 2, 4
pytestmark = pytest.mark.slow


def _env(devices: int) -> dict:
    return {
        **os.environ,
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
        "JAX_PLATFORMS": "cpu",
        "T2T_JAX_REEXEC": "0",
    }


def _command(workdir, *flags, cache=None) -> list[str]:
    return [
        sys.executable,
        "-m",
        "launch.main",
        "--config=configs/qwen3_4b.py:rehearsal",
        f"--workdir={workdir}",
        "--noprogress",
        *([f"--config.compilation_cache={cache}"] if cache else []),
        *flags,
    ]


def hosts(workdir, *flags, cache_root, stop_host=None, stop_when=None, timeout=900):
    """Run the rehearsal on HOSTS processes; `stop_when()` true -> SIGTERM to host `stop_host`.
    Returns [(exit code, output)] per host. Each host keeps its own compilation cache (a host that
    loads a step from a cache while its peer compiles it can drift past gloo's rendezvous)."""
    port = free_port()
    procs = []
    for i in range(HOSTS):
        dist = [
            "--config.distributed.enabled=True",
            f"--config.distributed.coordinator_address=127.0.0.1:{port}",
            f"--config.distributed.num_processes={HOSTS}",
            f"--config.distributed.process_id={i}",
        ]
        cache = cache_root / f"host{i}"
        procs.append(
            subprocess.Popen(
                _command(workdir, *flags, *dist, cache=cache),
                env=_env(DEVICES),
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    deadline, stopped = time.monotonic() + timeout, False
    while any(p.poll() is None for p in procs):
        if time.monotonic() > deadline:
            for p in procs:
                p.kill()
            pytest.fail("the hosts did not finish in time")
        if stop_when is not None and not stopped and stop_when():
            procs[stop_host].send_signal(signal.SIGTERM)
            stopped = True
        time.sleep(1)
    out = [(p.returncode, p.stdout.read()) for p in procs]
    assert stop_when is None or stopped, ("the stop condition never held", [(c, o[-3000:]) for c, o in out])
    return out


def records(workdir) -> tuple[list, list]:
    results = json.loads(storage.read_text(storage.join(workdir, "results.json")))
    proposals = [json.loads(x) for x in storage.read_text(storage.join(workdir, "proposals.jsonl")).splitlines()]
    return results, proposals


def test_two_hosts_on_a_bucket_stop_together_resume_and_match_one_host(tmp_path, emulator):
    single = tmp_path / "single"
    out = subprocess.run(
        _command(single, cache=tmp_path / "cache1"), env=_env(HOSTS * DEVICES), cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]

    workdir = f"gs://{BUCKET}/pod"
    checkpoints = storage.join(workdir, "checkpoints")
    # checkpoint 1: the initial point; 2: stage 0's first GRPO step (checkpoint.every = 1)
    mid_stage = lambda: storage.exists(checkpoints) and "2" in storage.listdir(checkpoints)  # noqa: E731
    first = hosts(workdir, cache_root=tmp_path, stop_host=1, stop_when=mid_stage)
    assert [code for code, _ in first] == [0, 0], [o[-3000:] for _, o in first]
    second = hosts(workdir, "--resume", cache_root=tmp_path)
    assert [code for code, _ in second] == [0, 0], [o[-3000:] for _, o in second]
    assert all("phase grpo, stage 0, step" in o for _, o in second)  # stopped inside stage 0's training
    assert records(workdir) == records(single)

    # A fresh start on a run that exists: refused on every host, at once, in one line.
    t0 = time.monotonic()
    again = hosts(workdir, cache_root=tmp_path, timeout=300)
    assert [code for code, _ in again] == [2, 2], [o[-3000:] for _, o in again]
    assert all("already holds a run" in o and "Traceback" not in o for _, o in again)
    assert time.monotonic() - t0 < 120
