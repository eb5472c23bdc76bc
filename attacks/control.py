"""Who is held out as a control record (anonymeter's baseline; REFERENCE.md "Measuring
leakage against a baseline").

A share of the persons is held out of the input before anything is profiled, searched,
counted or published; the common attacker then attacks them like members, and the
difference between the two success rates is what a release leaks about its members.

The rule is a keyed hash of the privacy unit's value (every row of a person goes the
same way) or, without a privacy unit, of the whole row: a row is held out when the keyed
hash falls below ``share × 2**64``. The keyed hash (:func:`keyed_hashes`) is AES-128 under
a key derived from the run's 16-byte secret (``cryptography``'s AES, one call per batch)
of the value's or row's unkeyed 64-bit fingerprint (``privpipe.hashing.value_hashes``:
strings by their bytes, no Python object per row), truncated to 64 bits: a pseudorandom
function of the fingerprint. The key is fresh per run from the OS CSPRNG and never
published, so nobody outside can tell who was held out; the rule is per row, so batches
split independently and two reads of the input identically.

It replaced pandas' SipHash of each fingerprint as an 8-byte Python object: a million
string ids 0.30–0.45 s against 0.10 s, a million 64-bit person hashes 0.10 against
0.045 s. A run's key file says which rule it was made with (``KEY_SCHEME``); a run of the
older rule cannot be rebuilt with the same members.
"""

from __future__ import annotations

import hashlib
import secrets
from functools import lru_cache

import numpy as np
import numpy.typing as npt
import pandas as pd
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from privpipe.hashing import combine_hashes, value_hashes

KEY_BYTES = 16  # the run's secret: 16 ASCII characters
KEY_SCHEME = "aes128-v2"  # the rule a key file's key is for (its first word)
_AES_KEY_CONTEXT = b"privpipe holdout and target sample: AES-128 of 64-bit fingerprints\x00"
_KEY_ALPHABET_BITS = 0x7F  # ASCII: the key is a str that must encode to 16 UTF-8 bytes


def new_holdout_key() -> str:
    """A fresh secret key (16 ASCII characters, 112 bits from ``secrets``), never a seed."""
    return bytes(b & _KEY_ALPHABET_BITS for b in secrets.token_bytes(KEY_BYTES)).decode("ascii")


def key_to_hex(key: str) -> str:
    """The key as the run's 0600 key file holds it: the rule (``KEY_SCHEME``), then the
    key as hex."""
    return f"{KEY_SCHEME} {key.encode('ascii').hex()}"


class OlderKeyScheme(ValueError):
    """A key file written for another holdout rule (an older privpipe's)."""


def key_from_hex(text: str) -> str:
    """The key back from :func:`key_to_hex`'s text; ``OlderKeyScheme`` if it is for
    another rule (a bare hex key: pandas' SipHash, before ``KEY_SCHEME``), ValueError if it
    is not a key at all."""
    words = text.split()
    if len(words) == 1 and len(words[0]) == 2 * KEY_BYTES:
        raise OlderKeyScheme(
            "the key is for the holdout rule of an older privpipe (SipHash of pandas' "
            f"fingerprints), not {KEY_SCHEME}"
        )
    if len(words) != 2:
        raise ValueError(f"a holdout key file is '{KEY_SCHEME} <hex>'")
    if words[0] != KEY_SCHEME:
        raise OlderKeyScheme(f"the key is for the holdout rule {words[0]!r}, not {KEY_SCHEME}")
    raw = bytes.fromhex(words[1])
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
    """Per value (Series) or row (DataFrame): a 64-bit pseudorandom function of it under
    ``key`` (module docstring). The same value gets the same hash in every batch; without
    the key nobody can tell the order."""
    if len(key.encode("utf-8")) != KEY_BYTES:
        raise ValueError(f"holdout key must be {KEY_BYTES} bytes")
    if isinstance(values, pd.DataFrame):
        fingerprint = combine_hashes([value_hashes(values[c]) for c in values.columns])
    else:
        fingerprint = value_hashes(values)
    blocks = np.zeros((fingerprint.shape[0], 2), dtype="<u8")  # one AES block per value
    blocks[:, 0] = fingerprint
    encryptor = Cipher(algorithms.AES(_aes_key(key)), modes.ECB()).encryptor()
    sealed = encryptor.update(blocks.tobytes()) + encryptor.finalize()
    return np.frombuffer(sealed, dtype="<u8")[0::2].astype(np.uint64)


@lru_cache(maxsize=16)
def _aes_key(key: str) -> bytes:
    """The AES-128 key of a run's secret (SHA-256 of it in this rule's context)."""
    return hashlib.sha256(_AES_KEY_CONTEXT + key.encode("utf-8")).digest()[:16]
