"""TensorBoard event files: scalars, text and images, written with TensorBoard's own writer.

    writer = SummaryWriter(workdir / "tb")
    writer.scalars(step, {"reward/valid": 0.4, "kl": 0.01})
    writer.text(step, "samples", "Agent 0: UP ...")
    writer.image(step, "failures", pil_image)
    writer.close()

No TensorFlow needed: events are `tensorboard.compat.proto` protobufs written by
`EventFileWriter`, read back in the tests with TensorBoard's `EventAccumulator`. Only process 0
of a multi-host run writes.
"""

from __future__ import annotations

import io
import time
from collections.abc import Mapping

import jax
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2
from tensorboard.plugins.text import metadata as text_metadata
from tensorboard.summary.writer.event_file_writer import EventFileWriter


class SummaryWriter:
    """Writes one event file under `logdir` (a no-op outside process 0)."""

    def __init__(self, logdir: str):
        self.active = jax.process_index() == 0
        self._writer = EventFileWriter(logdir) if self.active else None

    def _add(self, step: int, value: summary_pb2.Summary.Value) -> None:
        if self.active:
            event = event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary_pb2.Summary(value=[value]))
            self._writer.add_event(event)

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
        if self.active:
            self._writer.flush()

    def close(self) -> None:
        if self.active:
            self._writer.close()
