"""The SQLite store's schema (`ipam/sqlite_store.py`): the allocation table, the derived
bitmap tables that keep the search for a free address flat, and the triggers that maintain
them — so no code path can let the bitmaps drift from the allocations.
"""

from __future__ import annotations

import sqlite3

SCHEMA_VERSION = 1

SCHEMA = """
-- An address is split as super (address >> 16, 16 big-endian bytes), sub (the block within
-- the superblock, 0-255) and bit (the address within the block, 0-255).
CREATE TABLE IF NOT EXISTS allocation (
    network       TEXT    NOT NULL,
    family        INTEGER NOT NULL,          -- 4 or 6
    super         BLOB    NOT NULL,
    sub           INTEGER NOT NULL,
    bit           INTEGER NOT NULL,
    address       TEXT    NOT NULL,          -- the address as text, for people and queries
    container_id  TEXT    NOT NULL,
    ifname        TEXT    NOT NULL,
    pod_namespace TEXT    NOT NULL DEFAULT '',
    pod_name      TEXT    NOT NULL DEFAULT '',
    netns         TEXT    NOT NULL DEFAULT '',
    created       REAL    NOT NULL,
    PRIMARY KEY (network, family, super, sub, bit)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS allocation_owner ON allocation (network, container_id, ifname);
CREATE INDEX IF NOT EXISTS allocation_address ON allocation (address);

-- Derived from `allocation` by the triggers below; never written directly.
CREATE TABLE IF NOT EXISTS used_block (
    network TEXT    NOT NULL,
    family  INTEGER NOT NULL,
    super   BLOB    NOT NULL,
    sub     INTEGER NOT NULL,
    w0 INTEGER NOT NULL, w1 INTEGER NOT NULL, w2 INTEGER NOT NULL, w3 INTEGER NOT NULL,
    used    INTEGER NOT NULL,
    PRIMARY KEY (network, family, super, sub)
) WITHOUT ROWID;

-- Derived from `used_block`: bit `sub` is set while that block has all 256 addresses held.
CREATE TABLE IF NOT EXISTS full_block (
    network TEXT    NOT NULL,
    family  INTEGER NOT NULL,
    super   BLOB    NOT NULL,
    f0 INTEGER NOT NULL, f1 INTEGER NOT NULL, f2 INTEGER NOT NULL, f3 INTEGER NOT NULL,
    PRIMARY KEY (network, family, super)
) WITHOUT ROWID;

-- host-local's last_reserved_ip.N: allocation continues after this address.
CREATE TABLE IF NOT EXISTS cursor (
    network   TEXT    NOT NULL,
    range_set INTEGER NOT NULL,
    address   TEXT    NOT NULL,
    PRIMARY KEY (network, range_set)
) WITHOUT ROWID;

CREATE TRIGGER IF NOT EXISTS allocation_added AFTER INSERT ON allocation BEGIN
    INSERT INTO used_block (network, family, super, sub, w0, w1, w2, w3, used) VALUES (
        NEW.network, NEW.family, NEW.super, NEW.sub,
        CASE WHEN NEW.bit >> 6 = 0 THEN 1 << (NEW.bit & 63) ELSE 0 END,
        CASE WHEN NEW.bit >> 6 = 1 THEN 1 << (NEW.bit & 63) ELSE 0 END,
        CASE WHEN NEW.bit >> 6 = 2 THEN 1 << (NEW.bit & 63) ELSE 0 END,
        CASE WHEN NEW.bit >> 6 = 3 THEN 1 << (NEW.bit & 63) ELSE 0 END,
        1)
    ON CONFLICT (network, family, super, sub) DO UPDATE SET
        w0 = w0 | excluded.w0, w1 = w1 | excluded.w1,
        w2 = w2 | excluded.w2, w3 = w3 | excluded.w3, used = used + 1;
END;

CREATE TRIGGER IF NOT EXISTS allocation_removed AFTER DELETE ON allocation BEGIN
    UPDATE used_block SET
        w0 = CASE WHEN OLD.bit >> 6 = 0 THEN w0 & ~(1 << (OLD.bit & 63)) ELSE w0 END,
        w1 = CASE WHEN OLD.bit >> 6 = 1 THEN w1 & ~(1 << (OLD.bit & 63)) ELSE w1 END,
        w2 = CASE WHEN OLD.bit >> 6 = 2 THEN w2 & ~(1 << (OLD.bit & 63)) ELSE w2 END,
        w3 = CASE WHEN OLD.bit >> 6 = 3 THEN w3 & ~(1 << (OLD.bit & 63)) ELSE w3 END,
        used = used - 1
    WHERE network = OLD.network AND family = OLD.family AND super = OLD.super
      AND sub = OLD.sub;
    DELETE FROM used_block
    WHERE network = OLD.network AND family = OLD.family AND super = OLD.super
      AND sub = OLD.sub AND used <= 0;
END;

CREATE TRIGGER IF NOT EXISTS block_filled AFTER UPDATE OF used ON used_block
WHEN NEW.used = 256 BEGIN
    INSERT INTO full_block (network, family, super, f0, f1, f2, f3) VALUES (
        NEW.network, NEW.family, NEW.super,
        CASE WHEN NEW.sub >> 6 = 0 THEN 1 << (NEW.sub & 63) ELSE 0 END,
        CASE WHEN NEW.sub >> 6 = 1 THEN 1 << (NEW.sub & 63) ELSE 0 END,
        CASE WHEN NEW.sub >> 6 = 2 THEN 1 << (NEW.sub & 63) ELSE 0 END,
        CASE WHEN NEW.sub >> 6 = 3 THEN 1 << (NEW.sub & 63) ELSE 0 END)
    ON CONFLICT (network, family, super) DO UPDATE SET
        f0 = f0 | excluded.f0, f1 = f1 | excluded.f1,
        f2 = f2 | excluded.f2, f3 = f3 | excluded.f3;
END;

CREATE TRIGGER IF NOT EXISTS block_opened AFTER UPDATE OF used ON used_block
WHEN OLD.used = 256 AND NEW.used < 256 BEGIN
    UPDATE full_block SET
        f0 = CASE WHEN NEW.sub >> 6 = 0 THEN f0 & ~(1 << (NEW.sub & 63)) ELSE f0 END,
        f1 = CASE WHEN NEW.sub >> 6 = 1 THEN f1 & ~(1 << (NEW.sub & 63)) ELSE f1 END,
        f2 = CASE WHEN NEW.sub >> 6 = 2 THEN f2 & ~(1 << (NEW.sub & 63)) ELSE f2 END,
        f3 = CASE WHEN NEW.sub >> 6 = 3 THEN f3 & ~(1 << (NEW.sub & 63)) ELSE f3 END
    WHERE network = NEW.network AND family = NEW.family AND super = NEW.super;
    DELETE FROM full_block
    WHERE network = NEW.network AND family = NEW.family AND super = NEW.super
      AND f0 = 0 AND f1 = 0 AND f2 = 0 AND f3 = 0;
END;

-- An address row is never moved: the bitmaps would not follow it.
CREATE TRIGGER IF NOT EXISTS allocation_fixed BEFORE UPDATE OF network, family, super, sub, bit
ON allocation BEGIN
    SELECT RAISE(ABORT, 'allocation addresses are immutable; delete and insert');
END;
"""


def _split_sql(script: str) -> list[str]:
    """Statements of `script`, keeping trigger bodies (which contain ';') whole."""
    out: list[str] = []
    buf: list[str] = []
    for line in script.splitlines():
        if line.strip().startswith("--") or not line.strip():
            continue
        buf.append(line)
        text = "\n".join(buf)
        if sqlite3.complete_statement(text):
            out.append(text.strip())
            buf = []
    return out


def schema_statements() -> list[str]:
    """The statements that create (or complete) the schema, one by one."""
    return _split_sql(SCHEMA)
