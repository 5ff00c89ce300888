"""Fenced writes to a SQL sink through any DB-API 2 connection (sqlite3, psycopg, ...).

A worker passes its task id (``Lease.fence``: strictly increasing, new on every claim
and renewal) with each write; the sink keeps, per output key, the fence of the write it
holds and accepts a write only with a larger fence. A worker whose lease lapsed, and
whose task another worker claimed since, holds a smaller id than the new holder, so once
the new holder has written, the old one's writes are refused (:class:`StaleFence`)
instead of overwriting newer output. docs/fencing.md explains why this is sound.

::

    sink = FencedTable(conn, "reports")         # key -> (value, fence)
    sink.create_table()
    with conn:                                  # sqlite3: commit on success
        sink.write("report-42", text, lease.fence)

The default statement pair is portable SQL::

    UPDATE t SET value = ?, fence = ? WHERE key = ? AND fence < ?
    -- no row changed: insert if absent
    INSERT INTO t (key, value, fence) SELECT ?, ?, ? WHERE NOT EXISTS (SELECT 1 FROM t WHERE key = ?)
    -- no row inserted either: a fence >= ours is stored -> StaleFence

``upsert=True`` uses one statement instead (SQLite 3.24+, PostgreSQL 9.5+), which is
atomic even when two writers meet on a key that does not exist yet::

    INSERT INTO t (key, value, fence) VALUES (?, ?, ?)
    ON CONFLICT (key) DO UPDATE SET value = excluded.value, fence = excluded.fence
    WHERE t.fence < excluded.fence
"""

from __future__ import annotations

import re
import sys
from typing import Any, List, Optional, Sequence, Tuple

from .errors import StaleFence

__all__ = ["FencedTable", "fenced_write", "StaleFence"]

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _identifier(name: str, what: str) -> str:
    if not _IDENTIFIER.match(name):
        raise ValueError(f"{what} {name!r} is not a plain SQL identifier (letters, digits, _)")
    return name


def _paramstyle_of(conn: Any) -> str:
    module = sys.modules.get(type(conn).__module__.split(".")[0])
    style = getattr(module, "paramstyle", None)
    return style if isinstance(style, str) else "qmark"


class FencedTable:
    """A table of fenced outputs: ``key -> (value, fence)``, written only by larger fences.

    ``allow_equal=True`` accepts an equal fence too (``fence <= ?``): equal fences mean
    the same holder, so that is as safe against other holders and lets a holder rewrite
    its own output or retry a write whose answer it lost (with MySQL, connect with
    ``CLIENT_FOUND_ROWS``: otherwise a write of an unchanged value counts no row).
    ``upsert=True`` uses the single ``INSERT ... ON CONFLICT`` statement.

    ``conn`` is a DB-API 2 connection; ``paramstyle`` defaults to its driver module's
    (``qmark`` for sqlite3, ``pyformat``/``format`` for psycopg: ``%s``). The helper
    does not commit unless ``write(..., commit=True)``: make the fenced write part of
    the transaction that writes the output itself.
    """

    def __init__(
        self,
        conn: Any,
        table: str = "fenced_outputs",
        *,
        key_column: str = "key",
        value_column: str = "value",
        fence_column: str = "fence",
        paramstyle: Optional[str] = None,
        upsert: bool = False,
        allow_equal: bool = False,
    ) -> None:
        self.conn = conn
        self.table = _identifier(table, "table")
        self.key_column = _identifier(key_column, "key column")
        self.value_column = _identifier(value_column, "value column")
        self.fence_column = _identifier(fence_column, "fence column")
        self.paramstyle = paramstyle or _paramstyle_of(conn)
        if self.paramstyle not in ("qmark", "format", "pyformat", "numeric", "named"):
            raise ValueError(f"paramstyle {self.paramstyle!r} is not supported")
        self.upsert = upsert
        self.allow_equal = allow_equal
        self._newer = "<=" if allow_equal else "<"

    def _sql(self, template: str, count: int) -> str:
        """``template`` with ``{0}``..``{count-1}`` replaced by placeholders."""
        if self.paramstyle == "qmark":
            marks = ["?"] * count
        elif self.paramstyle in ("format", "pyformat"):
            marks = ["%s"] * count
        elif self.paramstyle == "numeric":
            marks = [f":{i + 1}" for i in range(count)]
        else:
            marks = [f":p{i}" for i in range(count)]
        return template.format(*marks)

    def _params(self, values: Sequence[Any]) -> Any:
        if self.paramstyle == "named":
            return {f"p{i}": v for i, v in enumerate(values)}
        return tuple(values)

    def _execute(self, template: str, values: Sequence[Any]) -> Tuple[int, List[Any]]:
        cursor = self.conn.cursor()
        try:
            cursor.execute(self._sql(template, len(values)), self._params(values))
            rows = cursor.fetchall() if cursor.description is not None else []
            return cursor.rowcount, list(rows)
        finally:
            cursor.close()

    def create_table(self, key_type: str = "TEXT", value_type: str = "TEXT") -> None:
        """``CREATE TABLE IF NOT EXISTS`` with the key as primary key and a BIGINT fence."""
        _identifier(key_type, "key type")
        _identifier(value_type, "value type")
        t, k, v, f = self.table, self.key_column, self.value_column, self.fence_column
        self._execute(
            f"CREATE TABLE IF NOT EXISTS {t} ({k} {key_type} PRIMARY KEY, {v} {value_type}, {f} BIGINT NOT NULL)",
            [],
        )

    def write(self, key: Any, value: Any, fence: int, *, commit: bool = False) -> None:
        """Stores ``value`` under ``key`` with ``fence`` if no write with a fence at least
        as large (larger, with ``allow_equal``) is stored; else raises
        :class:`~rota.errors.StaleFence` (nothing changed)."""
        if isinstance(fence, bool) or not isinstance(fence, int) or fence < 0:
            raise ValueError(f"a fence is a task id, a non-negative int; not {fence!r}")
        t, k, v, f = self.table, self.key_column, self.value_column, self.fence_column
        if self.upsert:
            changed, _ = self._execute(
                f"INSERT INTO {t} ({k}, {v}, {f}) VALUES ({{0}}, {{1}}, {{2}}) "
                f"ON CONFLICT ({k}) DO UPDATE SET {v} = excluded.{v}, {f} = excluded.{f} "
                f"WHERE {t}.{f} {self._newer} excluded.{f}",
                [key, value, fence],
            )
        else:
            changed, _ = self._execute(
                f"UPDATE {t} SET {v} = {{0}}, {f} = {{1}} WHERE {k} = {{2}} AND {f} {self._newer} {{3}}",
                [value, fence, key, fence],
            )
            if changed == 0:
                changed, _ = self._execute(
                    f"INSERT INTO {t} ({k}, {v}, {f}) SELECT {{0}}, {{1}}, {{2}} "
                    f"WHERE NOT EXISTS (SELECT 1 FROM {t} WHERE {k} = {{3}})",
                    [key, value, fence, key],
                )
        if changed == 0:
            raise StaleFence(key, fence, self.fence_of(key))
        if commit:
            self.conn.commit()

    def read(self, key: Any) -> Optional[Tuple[Any, int]]:
        """The stored ``(value, fence)`` of ``key``, or ``None``."""
        t, k, v, f = self.table, self.key_column, self.value_column, self.fence_column
        _, rows = self._execute(f"SELECT {v}, {f} FROM {t} WHERE {k} = {{0}}", [key])
        if not rows:
            return None
        return rows[0][0], int(rows[0][1])

    def fence_of(self, key: Any) -> Optional[int]:
        """The stored fence of ``key``, or ``None``."""
        row = self.read(key)
        return None if row is None else row[1]


def fenced_write(
    conn: Any,
    table: str,
    key: Any,
    value: Any,
    fence: int,
    *,
    commit: bool = False,
    **options: Any,
) -> None:
    """One fenced write: :meth:`FencedTable.write` on ``table`` (options as
    :class:`FencedTable` takes them). Raises :class:`~rota.errors.StaleFence`."""
    FencedTable(conn, table, **options).write(key, value, fence, commit=commit)
