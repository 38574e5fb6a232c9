"""Run directories on object storage (t2t_jax/storage.py): every file of a run directory, its lock,
its checkpoints' checksums and its TensorBoard events work on gs:// as on a disk, against a GCS
emulator (`gcp-storage-emulator`) started on 127.0.0.1 (the `emulator` fixture) with
STORAGE_EMULATOR_HOST pointing every layer (gcsfs, and tensorstore under Orbax) at it.

(The emulator and its fixes: tests/conftest.py `emulator`.)"""

import io as _io
import json
import os
import socket
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import BUCKET
from PIL import Image
from test_run_directory import config  # (the smoke config with changes: grpo__control=...)

from t2t_jax import rundir, storage
from t2t_jax.env import io

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_paths_resolve_and_join(emulator):
    assert storage.resolve("gs://b/run/") == "gs://b/run"
    assert storage.resolve("runs/x") == os.path.abspath("runs/x")
    assert storage.join("gs://b/run", "checkpoints", "3") == "gs://b/run/checkpoints/3"
    assert storage.dirname("gs://b/run/checkpoints") == "gs://b/run"


def test_the_emulator_answers_conditional_media_reads_as_gcs_does(emulator):
    # (tensorstore's path: the JSON API's ?alt=media; without the generation header and the 304, a
    # conditional re-read of an OCDBT manifest left it without a generation: "Malformed StorageGeneration")
    import urllib.error
    import urllib.parse
    import urllib.request

    storage.write_atomic(f"gs://{BUCKET}/cond/object", b"data")
    name = urllib.parse.quote("cond/object", safe="")
    meta = json.loads(urllib.request.urlopen(f"{emulator}/storage/v1/b/{BUCKET}/o/{name}").read())
    media = f"{emulator}/storage/v1/b/{BUCKET}/o/{name}?alt=media"
    with urllib.request.urlopen(media) as r:
        assert r.read() == b"data" and r.headers["x-goog-generation"] == meta["generation"]
    for query, code in ((f"ifGenerationNotMatch={meta['generation']}", 304), ("ifGenerationMatch=1", 412)):
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"{media}&{query}")
        assert e.value.code == code
    assert urllib.request.urlopen(f"{media}&ifGenerationMatch={meta['generation']}").read() == b"data"


def test_run_directory_fresh_resume_and_history_on_gs(emulator):
    workdir = f"gs://{BUCKET}/runs/one"
    run = rundir.open_run(workdir, config())
    assert storage.exists(storage.join(workdir, rundir.LOCK))  # held while the run lives
    written = storage.read_text(storage.join(workdir, "config.json"))
    assert json.loads(written)["seed"] == 0
    run.close()
    assert storage.listdir(workdir) == ["config.json"]  # the lock is released (deleted)
    with pytest.raises(rundir.RunDirError, match="already holds a run .*pass --resume"):
        rundir.open_run(workdir, config(seed=5))
    with pytest.raises(rundir.RunDirError, match=r"changes the run's maths: seed: 0 -> 3\."):
        rundir.open_run(workdir, config(seed=3), resume=True)
    rundir.open_run(workdir, config(stages=4), resume=True).close()
    rundir.open_run(workdir, config(stages=4, grpo__control="shuffle"), resume=True, allow=["grpo.control"]).close()
    history = rundir.read_history(workdir)
    assert [h["changes"] for h in history] == [{"stages": [2, 4]}, {"grpo.control": ["none", "shuffle"]}]
    assert storage.read_text(storage.join(workdir, "config.json")) == written  # never rewritten
    current = rundir.current_config(workdir)
    assert current["stages"] == 4 and current["grpo"]["control"] == "shuffle"
    with pytest.raises(rundir.RunDirError, match="holds no config.json"):
        rundir.open_run(f"gs://{BUCKET}/runs/none", config(), resume=True)
    with pytest.raises(rundir.RunDirError, match="gs://no-such-bucket/run: cannot write its lock .*bucket exists"):
        rundir.open_run("gs://no-such-bucket/run", config())
    # A fresh start that fails before its first checkpoint leaves nothing.
    failed = f"gs://{BUCKET}/runs/failed"
    run = rundir.open_run(failed, config())
    io.write_atomic(storage.join(failed, "tb", "events"), b"x")
    run.close(failed=True)
    assert not storage.exists(failed)
    assert not rundir.has_checkpoints(workdir)


def test_atomic_writes_on_gs(emulator):
    base = f"gs://{BUCKET}/writes"
    io.write_atomic(storage.join(base, "results.json"), json.dumps({"a": 1}))
    io.write_atomic(storage.join(base, "raw.bin"), b"\x00\x01")
    io.write_atomic(storage.join(base, "table.md"), (f"row {i}\n" for i in range(3)))
    io.write_jsonl(storage.join(base, "proposals.jsonl"), [{"a": 1}, {"b": 2}])
    io.write_png(storage.join(base, "heatmap.png"), Image.new("RGB", (12, 8), "red"))
    assert json.loads(storage.read_text(storage.join(base, "results.json"))) == {"a": 1}
    assert storage.read_bytes(storage.join(base, "raw.bin")) == b"\x00\x01"
    assert storage.read_text(storage.join(base, "table.md")) == "row 0\nrow 1\nrow 2\n"
    lines = storage.read_text(storage.join(base, "proposals.jsonl")).splitlines()
    assert [json.loads(x) for x in lines] == [{"a": 1}, {"b": 2}]
    assert Image.open(_io.BytesIO(storage.read_bytes(storage.join(base, "heatmap.png")))).size == (12, 8)

    def broken():
        yield {"a": 2}
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        io.write_jsonl(storage.join(base, "proposals.jsonl"), broken())
    assert storage.read_text(storage.join(base, "proposals.jsonl")).splitlines() == lines  # untouched
    storage.append_line(storage.join(base, "history.jsonl"), "{}")
    storage.append_line(storage.join(base, "history.jsonl"), '{"x": 1}')
    assert storage.read_text(storage.join(base, "history.jsonl")) == '{}\n{"x": 1}\n'
    assert storage.listdir(base) == sorted(
        ["results.json", "raw.bin", "table.md", "proposals.jsonl", "heatmap.png", "history.jsonl"]
    )
    with pytest.raises(FileExistsError):
        storage.create_exclusive(storage.join(base, "results.json"), "no")


def test_a_create_only_write_that_loses_the_race_is_refused_by_the_store(emulator, monkeypatch):
    path = f"gs://{BUCKET}/race/.lock"
    storage.create_exclusive(path, "first")
    fs = storage._fs(path)
    monkeypatch.setattr(type(fs), "exists", lambda self, p, **kw: False)  # (the object appears after the look)
    with pytest.raises(FileExistsError):
        storage.create_exclusive(path, "second")  # the put's ifGenerationMatch=0 gets 412
    assert storage.read_text(path) == "first"


def test_the_lock_refuses_a_second_opener_and_a_stale_lock_needs_break_lock(emulator, monkeypatch, capsys):
    workdir = f"gs://{BUCKET}/runs/locked"
    lock_path = storage.join(workdir, rundir.LOCK)
    monkeypatch.setattr(rundir, "HEARTBEAT_S", 0.2)
    held = rundir.open_run(workdir, config())
    try:
        first = json.loads(storage.read_text(lock_path))
        assert first["pid"] == os.getpid() and first["host"] == socket.gethostname()
        with pytest.raises(rundir.RunDirError, match=f"in use by another process .*{lock_path}.*pid {os.getpid()}"):
            rundir.open_run(workdir, config(), resume=True)
        with pytest.raises(rundir.RunDirError, match="in use by another process"):  # a live lock is not broken
            rundir.open_run(workdir, config(), resume=True, break_lock=True)
        time.sleep(1.0)
        assert json.loads(storage.read_text(lock_path))["heartbeat"] > first["heartbeat"]  # refreshed
    finally:
        held.close()
    assert not storage.exists(lock_path)
    # A lock left by a process that died: stale once its heartbeat is old.
    old = time.time() - rundir.STALE_S - 60
    dead = {"host": "another-host", "pid": 4242, "started": old, "heartbeat": old, "token": "dead"}
    storage.write_atomic(lock_path, json.dumps(dead))
    with pytest.raises(rundir.RunDirError, match=f"its lock {lock_path} is stale .*another-host.*pass --break_lock"):
        rundir.open_run(workdir, config(), resume=True)
    taken = rundir.open_run(workdir, config(), resume=True, break_lock=True)
    assert "took over the stale lock of host another-host" in capsys.readouterr().err
    assert json.loads(storage.read_text(lock_path))["pid"] == os.getpid()
    taken.close()
    assert not storage.exists(lock_path)
    # A lock of this host whose process is gone is stale at once (a SIGKILLed run resumed here).
    gone = subprocess.Popen(["true"])
    gone.wait()
    now = time.time()
    mine = {"host": socket.gethostname(), "pid": gone.pid, "started": now, "heartbeat": now, "token": "gone"}
    storage.write_atomic(lock_path, json.dumps(mine))
    with pytest.raises(rundir.RunDirError, match="is stale .*its process is gone.*--break_lock"):
        rundir.open_run(workdir, config(), resume=True)
    rundir.open_run(workdir, config(), resume=True, break_lock=True).close()
    # launch.main says it in one line and points at --break_lock.
    storage.write_atomic(lock_path, json.dumps(dead))
    out = subprocess.run(
        [sys.executable, "-m", "launch.main", "--config=configs/stage.py:smoke", f"--workdir={workdir}", "--resume"],
        cwd=ROOT,
        env={**os.environ, "JAX_PLATFORMS": "cpu", "T2T_JAX_REEXEC": "0"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "stale" in last and "--break_lock" in last and lock_path in last


def test_checkpoints_on_gs_are_verified_and_a_corrupt_one_set_aside(emulator, capsys, tmp_path, monkeypatch):
    from t2t_jax.checkpoint import CHECKSUMS, Checkpointer

    monkeypatch.chdir(tmp_path)  # (where os.path.abspath would have put ./gs:/...)

    base = f"gs://{BUCKET}/ckrun"
    directory = storage.join(base, "checkpoints")
    ckpt = Checkpointer(directory, keep=5)
    assert ckpt.directory == directory  # (no os.path.abspath of the URL)
    state = {"w": jnp.arange(4096.0).reshape(64, 64), "b": jnp.ones(8)}
    for step in (1, 2, 3):
        ckpt.save(step, jax.tree.map(lambda x: x * step, state), {"step": step})
    ckpt.close()
    assert os.listdir(tmp_path) == []  # (no stray local directory)
    for step in (1, 2, 3):
        sums = json.loads(storage.read_text(storage.join(directory, str(step), CHECKSUMS)))
        assert sums and all(size > 0 for size, _ in sums.values())
    assert Checkpointer(directory).latest_intact() == 3
    # Damage the largest object of step 3 (half its bytes): detected, set aside, step 2 restored.
    step3 = storage.join(directory, "3")
    sums = json.loads(storage.read_text(storage.join(step3, CHECKSUMS)))
    victim = max(sums, key=lambda rel: sums[rel][0])
    data = storage.read_bytes(storage.join(step3, victim))
    storage.write_atomic(storage.join(step3, victim), data[: len(data) // 2])
    assert Checkpointer(directory).latest_intact() == 2
    err = capsys.readouterr().err
    assert "warning: restoring checkpoint 2" in err and "3: " in err and os.path.basename(victim) in err
    assert storage.exists(storage.join(base, "corrupt_checkpoints", "3", victim))  # moved aside, not deleted
    assert not storage.exists(step3)
    fresh = Checkpointer(directory)
    assert fresh.latest() == 2
    restored, meta = fresh.restore(2, state)
    assert meta == {"step": 2}
    np.testing.assert_array_equal(np.asarray(restored["w"]), np.asarray(state["w"]) * 2)
    fresh.save(3, state, {"step": 30})  # the step number is free again
    assert fresh.restore(3, state)[1] == {"step": 30} and fresh.latest_intact() == 3
    fresh.close()


def test_tensorboard_on_gs_loses_nothing(emulator):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from t2t_jax.logging import SummaryWriter

    logdir = f"gs://{BUCKET}/tbrun/tb"
    writer = SummaryWriter(logdir)
    for step in range(30):
        writer.scalars(step, {"reward/valid": step / 30})
        if step % 7 == 6:
            writer.flush()
    writer.text(29, "samples", "Agent 0: UP")
    writer.image(29, "failures", Image.new("RGB", (12, 8), "red"))
    local = writer._local
    writer.close()
    assert not os.path.exists(local)  # (the local copy is gone; the bucket holds the events)
    assert len(storage.listdir(logdir)) == 1
    acc = EventAccumulator(logdir, size_guidance={"tensors": 0, "images": 0, "scalars": 0})
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("reward/valid")] == [(s, pytest.approx(s / 30)) for s in range(30)]
    assert acc.Tensors("samples")[0].tensor_proto.string_val[0].decode() == "Agent 0: UP"
    assert (acc.Images("failures")[0].width, acc.Images("failures")[0].height) == (12, 8)
