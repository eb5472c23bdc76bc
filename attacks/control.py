"""Who is held out as a control record (anonymeter's baseline; REFERENCE.md "Measuring
leakage against a baseline").

A share of the persons is held out of the input before anything is profiled, searched,
counted or published; the common attacker then attacks them like members, and the
difference between the two success rates is what a release leaks about its members.

The rule is a keyed hash of the privacy unit's value (every row of a person goes the
same way) or, without a privacy unit, of the whole row: a row is held out when the
64-bit SipHash, under a 16-byte key, of the value's pandas fingerprint
(``hash_pandas_object``) falls below ``share × 2**64``. The key is fresh per run from
the OS CSPRNG and never published, so nobody outside can tell who was held out; the
rule is per row, so batches split independently and two reads of the input identically.
"""

from __future__ import annotations

import secrets

import numpy as np
import numpy.typing as npt
import pandas as pd

KEY_BYTES = 16  # pandas' SipHash key length
_KEY_ALPHABET_BITS = 0x7F  # ASCII: the key is a str that must encode to 16 UTF-8 bytes


def new_holdout_key() -> str:
    """A fresh secret key (16 ASCII characters, 112 bits from ``secrets``), never a seed."""
    return bytes(b & _KEY_ALPHABET_BITS for b in secrets.token_bytes(KEY_BYTES)).decode("ascii")


def key_to_hex(key: str) -> str:
    """The key as hex text (what the run's 0600 key file holds)."""
    return key.encode("ascii").hex()


def key_from_hex(text: str) -> str:
    """The key back from :func:`key_to_hex`'s text; ValueError if it is not one."""
    raw = bytes.fromhex(text.strip())
    if len(raw) != KEY_BYTES or any(b > _KEY_ALPHABET_BITS for b in raw):
        raise ValueError(f"a holdout key is {KEY_BYTES} ASCII bytes as hex")
    return raw.decode("ascii")


def holdout_mask(
    batch: pd.DataFrame, share: float, key: str, unit: str | None = None
) -> npt.NDArray[np.bool_]:
    """True for the rows held out as controls: keyed hash of ``batch[unit]`` (every row of
    a person together) or of the whole row, below ``share`` of the hash range."""
    if not 0 < share <= 0.5:
        raise ValueError(f"holdout share must be in (0, 0.5], got {share!r}")
    if len(key.encode("utf-8")) != KEY_BYTES:
        raise ValueError(f"holdout key must be {KEY_BYTES} bytes")
    hashed = keyed_hashes(batch[unit] if unit is not None else batch, key)
    threshold = np.uint64(int(share * 2.0**64))  # share ≤ 0.5: at most 2**63
    return np.asarray(hashed < threshold, dtype=np.bool_)


def keyed_hashes(values: pd.Series | pd.DataFrame, key: str) -> npt.NDArray[np.uint64]:
    """Per value (Series) or row (DataFrame): its 64-bit SipHash under ``key``. The same
    value gets the same hash in every batch; without the key nobody can tell the order."""
    if len(key.encode("utf-8")) != KEY_BYTES:
        raise ValueError(f"holdout key must be {KEY_BYTES} bytes")
    # pandas keys only its hash of strings (numbers are mixed without the key): take the
    # unkeyed 64-bit fingerprint of each value/row, then SipHash its 8 bytes with the key
    # (a fixed-width byte string with trailing NULs stripped is still one-to-one)
    fingerprint = pd.util.hash_pandas_object(values, index=False, categorize=False)
    as_bytes = fingerprint.to_numpy(dtype="<u8").view("S8").astype(object)
    hashed = pd.util.hash_array(as_bytes, hash_key=key, categorize=False)
    return np.asarray(hashed, dtype=np.uint64)
