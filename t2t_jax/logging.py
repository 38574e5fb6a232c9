"""TensorBoard event files: scalars, text and images, written with TensorBoard's own writer.

    writer = SummaryWriter(workdir / "tb")
    writer.scalars(step, {"reward/valid": 0.4, "kl": 0.01})
    writer.text(step, "samples", "Agent 0: UP ...")
    writer.image(step, "failures", pil_image)
    writer.close()

No TensorFlow needed: events are `tensorboard.compat.proto` protobufs written by
`EventFileWriter`, read back in the tests with TensorBoard's `EventAccumulator`. Only process 0
of a multi-host run writes.

On object storage (a gs:// `logdir`), where an object cannot be appended to, the event file is
written to a local temporary directory and uploaded whole (one object put, t2t_jax/storage.py)
on `flush()`, on `close()` and at most every `UPLOAD_SECS` as events are added: nothing is lost,
and a crash loses only what came after the last upload.
"""

from __future__ import annotations

import io
import os
import shutil
import tempfile
import time
from collections.abc import Mapping

import jax
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2
from tensorboard.plugins.text import metadata as text_metadata
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from t2t_jax import storage

UPLOAD_SECS = 120.0  # (gs://) the longest the bucket's event file lags behind the local one


class SummaryWriter:
    """Writes one event file under `logdir` (a no-op outside process 0)."""

    def __init__(self, logdir: str):
        self.active = jax.process_index() == 0
        self.logdir = storage.resolve(logdir) if storage.is_url(logdir) else logdir
        self._local = tempfile.mkdtemp(prefix="t2t_tb_") if self.active and storage.is_url(logdir) else None
        self._writer = EventFileWriter(self._local or logdir) if self.active else None
        self._uploaded = time.monotonic()

    def _add(self, step: int, value: summary_pb2.Summary.Value) -> None:
        if self.active:
            event = event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary_pb2.Summary(value=[value]))
            self._writer.add_event(event)
            if self._local is not None and time.monotonic() - self._uploaded > UPLOAD_SECS:
                self.flush()

    def _upload(self) -> None:
        """(gs://) The local event file(s), whole, over their objects under `logdir`."""
        for name in sorted(os.listdir(self._local)):
            storage.upload(os.path.join(self._local, name), storage.join(self.logdir, name))
        self._uploaded = time.monotonic()

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        for tag, v in values.items():
            self._add(step, summary_pb2.Summary.Value(tag=tag, simple_value=float(v)))

    def text(self, step: int, tag: str, text: str) -> None:
        tensor = tensor_pb2.TensorProto(
            dtype=7,
            string_val=[text.encode()],  # 7: DT_STRING
            tensor_shape=tensor_shape_pb2.TensorShapeProto(),
        )
        meta = text_metadata.create_summary_metadata(display_name=tag, description="")
        self._add(step, summary_pb2.Summary.Value(tag=tag, metadata=meta, tensor=tensor))

    def image(self, step: int, tag: str, image) -> None:
        """A PIL image, stored as PNG."""
        buf = io.BytesIO()
        image.save(buf, format="PNG")
        w, h = image.size
        img = summary_pb2.Summary.Image(
            height=h, width=w, colorspace=len(image.getbands()), encoded_image_string=buf.getvalue()
        )
        self._add(step, summary_pb2.Summary.Value(tag=tag, image=img))

    def flush(self) -> None:
        if self.active and self._writer is not None:
            self._writer.flush()
            if self._local is not None:
                self._upload()

    def close(self) -> None:
        if self.active and self._writer is not None:
            self._writer.close()
            if self._local is not None:
                self._upload()
                shutil.rmtree(self._local, ignore_errors=True)
            self._writer = None
