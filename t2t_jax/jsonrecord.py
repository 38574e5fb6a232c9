"""`JsonRecord`: a typed record that is also the JSON object it is written as (a leaf module).

    @dataclasses.dataclass(frozen=True, eq=False)
    class Account(JsonRecord):
        stage: int
        ...
    account.stage == account["stage"]; json.dumps(account); Account.from_json(json.loads(text))

Code that builds and uses a record reads its fields by attribute; it is also a read-only `dict`
of those fields, so files, JSON and older readers see the same object as before the type
existed. A field named in `OPTIONAL` whose value is None is not a key (absent from the JSON, as
such keys were before they existed); every other field is always a key, None included. Change a
record with `replace(**fields)`, never by item.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import ClassVar


def _read_only(self, *args, **kwargs):
    raise TypeError(f"{type(self).__name__} is read-only: use .replace(field=value)")


@dataclasses.dataclass(frozen=True, eq=False)
class JsonRecord(dict):
    OPTIONAL: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self):
        names = (f.name for f in dataclasses.fields(self))
        dict.update(
            self, {n: getattr(self, n) for n in names if n not in self.OPTIONAL or getattr(self, n) is not None}
        )

    __setitem__ = __delitem__ = update = pop = popitem = clear = setdefault = __ior__ = _read_only

    def __reduce__(self):  # (copy and pickle through the fields, not dict's empty constructor)
        return type(self).from_json, (dict(self),)

    def to_json(self) -> dict:
        """The JSON object (a plain dict; its values are JSON already)."""
        return dict(self)

    @classmethod
    def from_json(cls, data: Mapping):
        """The record of a JSON object; keys it lacks read as None (records of older runs)."""
        if isinstance(data, cls):
            return data
        return cls(**{f.name: data.get(f.name) for f in dataclasses.fields(cls)})

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)
