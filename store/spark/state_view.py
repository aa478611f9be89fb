"""A read-only, typed view of one state partition: its rows, timers and committed changes.

The state reader (store/spark/reader.py) and tests read state through this view: keys and values
decode through the schemas recorded in the store's ``__meta`` column family, and a change feed decodes
the committed changelogs of a range of versions with the same schemas. Nothing is written, and bytes
that do not decode are refused with :class:`~store.formats.typed_scalars.CorruptStateError` naming the
variable and, for the change feed, the changelog file.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from statekeeper.store.files import CheckpointFileManager
from statekeeper.store.files.base import open_seekable
from statekeeper.store.formats.changelog import ChangelogReader
from statekeeper.store.formats.typed_keys import KeyCodec
from statekeeper.store.formats.typed_scalars import CorruptStateError
from statekeeper.store.formats.typed_schema import DataType, SchemaError, from_json
from statekeeper.store.layout import StoreId
from statekeeper.store.load_plan import check_header, check_parent
from statekeeper.store.spark.schemas import (
    META_CF,
    SchemaBytes,
    ValueFormat,
    VariableRecord,
    element_expiries,
    expiry_of,
    read_grouping_key,
    read_record,
    schema_key,
    variable_names,
)
from statekeeper.store.spark.state import KEY_GROUP_BYTES, TIMERS_CF, grouping_key_codec
from statekeeper.store.state_store import StateStore


@dataclass(frozen=True)
class Change:
    """One committed change of a state variable's row."""

    batch_id: int
    change_type: str
    """``update`` or ``delete``."""
    key: Any
    user_key: Any
    value: Any
    expiry_ms: int | None


class TypedSchemas:
    """The schemas recorded for one operator's state: decode stored keys, values and changelogs.

    Built from a loaded store (:class:`StateView`) or from schemas read once on the driver (the change
    feed decodes changelogs of any partition without loading a store); `where` names it in errors.
    """

    def __init__(self, key_schema: DataType | None, records: dict[str, VariableRecord], where: str) -> None:
        self.key_schema = key_schema
        self.records = records
        self.where = where
        self.key_codec = grouping_key_codec(key_schema) if key_schema is not None else None
        self._formats: dict[str, ValueFormat] = {}

    def value_schema(self, name: str) -> DataType | None:
        record = self.records.get(name)
        return None if record is None else record.schemas.get(record.schema_id)

    def value_format(self, name: str) -> ValueFormat:
        fmt = self._formats.get(name)
        if fmt is None:
            record = self._record(name)
            fmt = ValueFormat(name, record.kind == "list", self.where)
            fmt.use(record.schema_id, record.schemas.get(record.schema_id), record.schemas)
            self._formats[name] = fmt
        return fmt

    def _record(self, name: str) -> VariableRecord:
        record = self.records.get(name)
        if record is None:
            raise CorruptStateError(f"state variable {name!r} has no schema record{self.where}")
        return record

    def _user_key_codec(self, name: str) -> KeyCodec | None:
        schema = self._record(name).user_key_schema
        return None if schema is None else KeyCodec(schema, f"state variable {name!r}, map key")

    def split_key(self, name: str, storage_key: bytes, uk_codec: KeyCodec | None) -> tuple[Any, Any]:
        """(grouping key, map key or None) of a stored key."""
        codec = self.key_codec
        if codec is None:
            raise CorruptStateError(f"no grouping key schema is recorded{self.where}")
        if uk_codec is None:
            return codec.decode(storage_key, KEY_GROUP_BYTES), None
        key, end = codec.decode_prefix(storage_key, KEY_GROUP_BYTES)
        return key, uk_codec.decode(storage_key, end)

    def changes_of(
        self,
        fm: CheckpointFileManager,
        store: StoreId,
        name: str,
        refs: Iterable[tuple[int, str, int]],
        parent: str | None = None,
    ) -> Iterator[Change]:
        """The committed changes of `name` in the changelogs of `store` at `refs` ((version, checkpoint id,
        batch id), in order); each change carries its ref's batch id. `parent`: the committed checkpoint id of
        the version before the first ref, when it is known (the first changelog must extend it)."""
        fmt = self.value_format(name)
        uk_codec = self._user_key_codec(name) if self._record(name).kind == "map" else None
        before: tuple[int, str] | None = None
        for version, ckpt, batch in refs:
            path = store.changelog(version, ckpt)
            where = f"{fm.root_uri}/{path}"
            if before is None and parent is not None:
                before = (version - 1, parent)
            with open_seekable(fm, path) as f:
                reader = ChangelogReader(f, where)
                # the file is the committed attempt's, and it extends the committed attempt before it
                check_header(store, reader.header, version, ckpt, where)
                if before is not None and before[0] == version - 1:
                    check_parent(store, reader.header, before[1], where)
                before = (version, ckpt)
                reader.check_footer()
                for cf, keys, values in reader.blocks():
                    if cf == META_CF:
                        self._check_schemas(name, keys, values, where)
                    if cf != name:
                        continue
                    for k, raw in zip(keys, values, strict=True):
                        try:
                            key, uk = self.split_key(name, k, uk_codec)
                            value = None if raw is None else fmt.decode(raw)
                        except CorruptStateError as e:
                            raise CorruptStateError(f"{e} in changelog {where}") from None
                        yield Change(
                            batch,
                            "delete" if raw is None else "update",
                            key,
                            uk,
                            value,
                            None if raw is None else expiry_of(raw),
                        )

    def _check_schemas(self, name: str, keys: list[bytes], values: list[bytes | None], where: str) -> None:
        """Refuse a changelog that records another schema under an id these schemas know differently:
        its values would decode under the wrong schema (each partition numbers its own schemas; the
        change feed decodes every partition with the end version's, as a rescale requires them equal)."""
        prefix = schema_key(name, 0)[:-4]
        known = self._record(name).schemas
        for k, v in zip(keys, values, strict=True):
            if v is None or len(k) != len(prefix) + 4 or not k.startswith(prefix):
                continue
            sid = int.from_bytes(k[len(prefix) :], "big")
            try:
                same = from_json(SchemaBytes().take(v, f"schema {sid} of state variable {name!r}")) == known.get(sid)
            except (SchemaError, CorruptStateError):  # not a schema, or wider than any a writer records
                same = False
            if not same:
                raise CorruptStateError(
                    f"changelog {where} records schema {sid} of state variable {name!r} unlike the schemas read"
                    f"{self.where}: partitions number their schemas differently, so the change feed cannot "
                    "decode them with one set (read each partition at its own version instead)"
                )


class StateView(TypedSchemas):
    """Typed rows of one loaded store."""

    def __init__(self, store: StateStore) -> None:
        self.store = store
        sid = store.store_id
        names = store.column_families()
        records: dict[str, VariableRecord] = {}
        key_schema: DataType | None = None
        if META_CF in names:
            meta = store.column_family(META_CF)
            taken = SchemaBytes()  # all of them held: at most MAX_SCHEMAS_BYTES
            key_schema = read_grouping_key(meta, taken)
            for name in variable_names(meta):
                record = read_record(meta, name, taken)
                if record is not None:
                    records[name] = record
        super().__init__(key_schema, records, f" (operator {sid.operator} partition {sid.partition})")

    def rows(self, name: str) -> Iterator[tuple[Any, Any, Any, int | None]]:
        """(grouping key, map key or None, value, expiry ms or None) of every row, in key order (a list whose
        elements expire apart: its earliest expiry; see :meth:`elements`)."""
        if name not in self.store.column_families():
            return
        fmt = self.value_format(name)
        uk_codec = self._user_key_codec(name) if self._record(name).kind == "map" else None
        for k, raw in self.store.column_family(name).items():
            key, uk = self.split_key(name, k, uk_codec)
            yield key, uk, fmt.decode(raw), expiry_of(raw)

    def elements(self, name: str) -> Iterator[tuple[Any, Any, int | None]]:
        """(grouping key, element, its expiry ms or None) of every element of ListState `name`, in key order."""
        if name not in self.store.column_families():
            return
        fmt = self.value_format(name)
        for k, raw in self.store.column_family(name).items():
            key, _ = self.split_key(name, k, None)
            values = fmt.decode(raw)
            for value, expiry in zip(values, element_expiries(raw, len(values)), strict=True):
                yield key, value, expiry

    def timers(self) -> Iterator[tuple[Any, int]]:
        """(grouping key, expiry ms) of every registered timer."""
        if TIMERS_CF not in self.store.column_families() or self.key_codec is None:
            return
        for k, _ in self.store.column_family(TIMERS_CF).items():
            key, end = self.key_codec.decode_prefix(k, KEY_GROUP_BYTES)
            if len(k) != end + 8:
                raise CorruptStateError(f"{TIMERS_CF} key {bytes(k[:64])!r} is not grouping key | expiry{self.where}")
            yield key, int.from_bytes(k[end:], "big")

    def changes(self, fm: CheckpointFileManager, name: str, versions: list[tuple[int, str]]) -> Iterator[Change]:
        """The committed changes of `name` in this store's changelogs of `versions` ((version, checkpoint id),
        in order), numbered as batch ``version - 1`` (the store alone does not know its commit records)."""
        return self.changes_of(fm, self.store.store_id, name, ((v, c, v - 1) for v, c in versions))


__all__ = ["Change", "StateView", "TypedSchemas", "check_typed_state"]


def check_typed_state(store: StateStore, fm: CheckpointFileManager, versions: list[tuple[int, str]]) -> list[str]:
    """Decode every row of the loaded store and every record of the given changelogs through the
    recorded schemas; one error per variable that does not decode (naming the changelog file).

    Stores without schema records (the raw key-value API) are not typed and have nothing to check.
    """
    view = StateView(store)
    errors: list[str] = []
    for name in sorted(view.records):
        try:
            for _ in view.changes(fm, name, versions):
                pass
            for _ in view.rows(name):
                pass
        except CorruptStateError as e:
            errors.append(str(e))
    return errors
