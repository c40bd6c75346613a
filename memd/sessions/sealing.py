"""Keyed hashes: what the state database stores of a message can't be checked against a guess.

The prefix index (memd.sessions.prefix) chains plain blake2b over each message's
canonical key; a stored chained hash of a short message (`yes`, a PIN, a name) could be
confirmed by anyone who can read the database and guess the text, even after the text
itself was removed from the transcript. So what is stored, and looked up, is the chained
hash sealed with a per-client secret: `blake2b(h, key=K)` (blake2b's keyed mode is a MAC).
The same holds for `record_exchange`'s idempotency digests.

The key is 32 random bytes in `<client>/.memd/hash.key` (0600, made on first open). A
database written before keys existed holds plain hashes; `seal_database` seals each one
in place, once (PRAGMA user_version goes from 0 to 1), which keeps every continuation and
every exchange_id recognised: sealing the plain value is what new calls compute too.
Losing the key file costs recognition only: the next request of an old conversation
starts a new one, and a retried exchange_id is written again.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
from collections.abc import Iterable

import structlog

from memd import trust
from memd.layout import ClientLayout

log = structlog.get_logger()

KEY_FILE = "hash.key"
KEY_BYTES = 32
SEALED_VERSION = 1  # PRAGMA user_version of a database whose hashes are sealed


def seal(key: bytes, h: bytes) -> bytes:
    """The stored form of a 16-byte hash."""
    return hashlib.blake2b(h, digest_size=16, key=key).digest()


def seal_all(key: bytes, hashes: Iterable[bytes]) -> list[bytes]:
    return [seal(key, h) for h in hashes]


def mask(key: bytes, h: bytes) -> bytes:
    """The `head` record_chat answers for the plain chained hash `h`: `h` XOR a pad derived
    from the client's key. A gateway keeps heads (the proxy's response-id map), so a head
    must not confirm a guessed history either; `unmask` gives memd the plain hash back to
    chain on from, so a turn sent after a head hashes as if the whole history were sent."""
    pad = hashlib.blake2b(b"memd record_chat head", digest_size=len(h), key=key).digest()
    return bytes(a ^ b for a, b in zip(h, pad, strict=True))


unmask = mask  # XOR with the same pad undoes it


def client_key(layout: ClientLayout) -> bytes:
    """The client's key, made (0600, fsynced) the first time; an unusable file is an error."""
    path = layout.state_dir / KEY_FILE
    trust.check_file(path)
    try:
        fd = trust.open_nofollow(path, os.O_RDONLY)
    except FileNotFoundError:
        return _make_key(layout)
    with os.fdopen(fd, "rb") as fh:
        key = fh.read()
    if len(key) != KEY_BYTES:
        raise OSError(f"{path} is not a {KEY_BYTES}-byte key; move it away to make a new one")
    return key


def _make_key(layout: ClientLayout) -> bytes:
    path = layout.state_dir / KEY_FILE
    key = os.urandom(KEY_BYTES)
    try:
        fd = trust.open_nofollow(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # made meanwhile by another opener: use that one
        return client_key(layout)
    try:
        os.write(fd, key)
        os.fsync(fd)
    finally:
        os.close(fd)
    trust.fsync_dir(layout.state_dir)
    return key


def seal_database(db: sqlite3.Connection, key: bytes, client_id: str) -> bool:
    """Seal a database's plain hashes once (see module doc); True when it did.

    One transaction: a crash leaves it all plain (and it runs again) or all sealed.
    """
    if db.execute("PRAGMA user_version").fetchone()[0] >= SEALED_VERSION:
        return False
    db.execute("BEGIN IMMEDIATE")
    try:
        nodes = db.execute("SELECT hash, conv, exchange, parent FROM nodes").fetchall()
        db.execute("DELETE FROM nodes")
        db.executemany(
            "INSERT OR REPLACE INTO nodes VALUES (?,?,?,?)",
            [
                (seal(key, h), conv, ex, seal(key, parent) if parent is not None else None)
                for h, conv, ex, parent in nodes
            ],
        )
        digests = db.execute("SELECT conv, exchange_id, digest FROM exchange_keys").fetchall()
        db.executemany(
            "UPDATE exchange_keys SET digest = ? WHERE conv = ? AND exchange_id = ?",
            [(seal(key, d), conv, xid) for conv, xid, d in digests],
        )
        db.execute(f"PRAGMA user_version = {SEALED_VERSION}")
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    if nodes or digests:
        log.info("sessions.hashes_sealed", client=client_id, nodes=len(nodes), keys=len(digests))
    return bool(nodes or digests)
