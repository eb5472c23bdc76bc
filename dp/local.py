"""Local DP frequency oracles (Wang et al., USENIX Security 2017): perturb, then estimate.

Each person's value is an integer code in [0, d). The client-side randomiser
(:meth:`FrequencyOracle.perturb`) turns a batch of codes into :class:`Reports`; the server
counts, for every value v, the reports that *support* v (:func:`support_counts`) and
de-biases: ĉ(v) = (I_v − n·q*)/(p* − q*) (:func:`estimate`). Support counts are sums, so
a distributed job combines per-batch ``(n, I)`` by addition before estimating.

Protocols (``PROTOCOLS``): ``rr`` Warner randomised response (d = 2); ``grr`` direct
encoding; ``sue`` basic RAPPOR (ε/2 per bit); ``oue`` optimised unary encoding; ``blh``
binary local hashing (g = 2); ``olh`` optimised local hashing (g = round(e^ε) + 1).
``choose_protocol`` picks the lowest-variance one for ``protocol: auto``.

Randomness comes from a :class:`dp.secure_random.RandomSource` (the OS CSPRNG in
production). Probabilities are rounded so that no ratio exceeds e^ε (see that module).
Hashing protocols give every person a fresh 64-bit key from the source; the key is part of
the report, as the protocol requires, and the keyed hash (splitmix64 mixing in uint64
arithmetic) is public.

Reports serialise to a DataFrame (:func:`reports_to_frame`, :func:`reports_from_frame`) so
collection and aggregation can run as separate jobs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import pandas as pd

from privpipe.dp.secure_random import RandomSource, UInt8Array, UInt64Array
from privpipe.errors import ConfigError, InputDataError

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

ProtocolName = Literal["rr", "grr", "sue", "oue", "blh", "olh"]
PROTOCOLS: tuple[str, ...] = ("rr", "grr", "sue", "oue", "blh", "olh")
UNARY = ("sue", "oue")
HASHING = ("blh", "olh")
# Tie-break order for `auto` (smaller reports first among equal variances).
_AUTO_ORDER: tuple[str, ...] = ("grr", "oue", "olh", "sue", "blh")
MAX_EPSILON = 30.0  # beyond this the randomiser is practically the identity (and g > 2^43)
CHUNK_ROWS = 1 << 16  # rows per chunk for n×d work (bounded temporary memory)


# --------------------------------------------------------------------------- parameters


def _check_epsilon(epsilon: float) -> float:
    try:
        eps = float(epsilon)
    except (TypeError, ValueError):
        raise ConfigError(f"epsilon must be a number > 0, got {epsilon!r}") from None
    if isinstance(epsilon, bool) or not math.isfinite(eps) or eps <= 0.0:
        raise ConfigError(f"epsilon must be a finite number > 0, got {epsilon!r}")
    if eps > MAX_EPSILON:
        raise ConfigError(f"local DP epsilon must be <= {MAX_EPSILON:g}, got {epsilon!r}")
    return eps


def _check_domain(d: int) -> int:
    if isinstance(d, bool) or not isinstance(d, int | np.integer) or d < 2:
        raise ConfigError(f"the domain size d must be an integer >= 2, got {d!r}")
    return int(d)


def _check_protocol(protocol: str) -> str:
    if protocol not in PROTOCOLS:
        raise ConfigError(
            f"unknown local DP protocol {protocol!r}; choose one of {', '.join(PROTOCOLS)} or auto"
        )
    return protocol


def olh_g(epsilon: float) -> int:
    """OLH's hash range g = round(e^ε) + 1 (the variance-optimal integer, Wang et al.)."""
    return max(2, round(math.exp(_check_epsilon(epsilon))) + 1)


@dataclass(frozen=True)
class OracleParameters:
    """The probabilities of one protocol at (ε, d), for reports and checks.

    ``p_keep``/``q_other``: the randomiser's probabilities (for unary encodings, of a 1 bit
    for the true / any other value; for hashing, of GRR over the g hash buckets).
    ``p_star``/``q_star``: the probability that a report supports v when the person holds
    v / another value, used by the unbiased estimator. ``g``: hash range (hashing only).
    """

    protocol: str
    epsilon: float
    d: int
    p_keep: float
    q_other: float
    p_star: float
    q_star: float
    g: int | None

    @property
    def implied_epsilon(self) -> float:
        """The largest log-ratio of the randomiser's output probabilities (should equal ε)."""
        p, q = self.p_keep, self.q_other
        if self.protocol in UNARY:
            return math.log(p * (1.0 - q) / ((1.0 - p) * q))
        return math.log(p / q)

    def as_dict(self) -> dict[str, Any]:
        return {
            "protocol": self.protocol,
            "epsilon": self.epsilon,
            "d": self.d,
            "p": self.p_keep,
            "q": self.q_other,
            "p_star": self.p_star,
            "q_star": self.q_star,
            "g": self.g,
            "implied_epsilon": self.implied_epsilon,
        }


def parameters(protocol: str, epsilon: float, d: int) -> OracleParameters:
    """p, q (randomiser) and p*, q* (estimator) of ``protocol`` at (ε, d)."""
    protocol = _check_protocol(protocol)
    eps = _check_epsilon(epsilon)
    d = _check_domain(d)
    e = math.exp(eps)
    if protocol == "rr":
        if d != 2:
            raise ConfigError(f"randomised response (rr) is for yes/no attributes (d = 2), got {d}")
        p, q = e / (e + 1.0), 1.0 / (e + 1.0)
        return OracleParameters(protocol, eps, d, p, q, p, q, None)
    if protocol == "grr":
        p, q = e / (e + d - 1.0), 1.0 / (e + d - 1.0)
        return OracleParameters(protocol, eps, d, p, q, p, q, None)
    if protocol == "sue":
        h = math.exp(eps / 2.0)
        p, q = h / (h + 1.0), 1.0 / (h + 1.0)
        return OracleParameters(protocol, eps, d, p, q, p, q, None)
    if protocol == "oue":
        p, q = 0.5, 1.0 / (e + 1.0)
        return OracleParameters(protocol, eps, d, p, q, p, q, None)
    g = 2 if protocol == "blh" else olh_g(eps)
    p, q = e / (e + g - 1.0), 1.0 / (e + g - 1.0)
    return OracleParameters(protocol, eps, d, p, q, p, 1.0 / g, g)


def variance(protocol: str, n: int, epsilon: float, d: int, count: float | None = None) -> float:
    """Variance of the estimated count of one value among n persons.

    Without ``count``: REFERENCE.md's table, n·q*(1−q*)/(p*−q*)² (the true count's term
    neglected, as in Wang et al.). With ``count`` c: the exact
    n·q*(1−q*)/(p*−q*)² + c·(1−p*−q*)/(p*−q*).
    """
    par = parameters(protocol, epsilon, d)
    if n < 0:
        raise ConfigError(f"n must be >= 0, got {n}")
    p, q = par.p_star, par.q_star
    base = n * q * (1.0 - q) / (p - q) ** 2
    if count is None:
        return base
    return base + float(count) * (1.0 - p - q) / (p - q)


def choose_protocol(epsilon: float, d: int) -> str:
    """``protocol: auto``: the protocol of lowest table variance at (ε, d) (rr when d = 2)."""
    eps, d = _check_epsilon(epsilon), _check_domain(d)
    if d == 2:
        return "rr"
    scores = {name: variance(name, 1, eps, d) for name in _AUTO_ORDER}
    low = min(scores.values())
    # the first in the tie-break order among (numerically) equal variances
    return next(name for name in _AUTO_ORDER if scores[name] <= low * (1.0 + 1e-12))


# --------------------------------------------------------------------------- hashing

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix64(z: UInt64Array) -> UInt64Array:
    """splitmix64's finaliser: a bijective avalanche mix of 64-bit words (in place)."""
    with np.errstate(over="ignore"):  # uint64 arithmetic wraps modulo 2^64 by design
        z ^= z >> np.uint64(30)
        z *= _M1
        z ^= z >> np.uint64(27)
        z *= _M2
        z ^= z >> np.uint64(31)
    return z


def keyed_hash(keys: UInt64Array, values: IntArray | int, g: int) -> IntArray:
    """h_key(v) ∈ [0, g): mix64(key XOR mix64(v·φ + φ)) mod g, vectorised (public function)."""
    v = np.atleast_1d(np.asarray(values)).astype(np.uint64)
    with np.errstate(over="ignore"):
        vm = _mix64((v + np.uint64(1)) * _GOLDEN)
    z = np.bitwise_xor(np.asarray(keys, dtype=np.uint64), vm)
    return (_mix64(z) % np.uint64(g)).astype(np.int64)


# --------------------------------------------------------------------------- reports


@dataclass(frozen=True, eq=False)
class Reports:
    """A batch of perturbed reports of one protocol at (ε, d).

    ``values``: rr/grr the reported code, blh/olh the reported hash bucket in [0, g).
    ``bits``: sue/oue, the n × ⌈d/8⌉ packed bit matrix (numpy.packbits, big-endian bits).
    ``keys``: blh/olh, each person's public hash key.
    """

    protocol: str
    epsilon: float
    d: int
    n: int
    values: IntArray | None = None
    bits: UInt8Array | None = None
    keys: UInt64Array | None = None
    g: int | None = field(default=None)

    def unpacked_bits(self) -> UInt8Array:
        """The n × d 0/1 matrix of a unary report (memory n·d bytes)."""
        if self.bits is None:
            raise ConfigError(f"{self.protocol} reports carry no bit vectors")
        return np.unpackbits(self.bits, axis=1, count=self.d)


def _codes(codes: npt.ArrayLike, d: int) -> IntArray:
    arr = np.asarray(codes)
    if arr.dtype.kind not in "iub":
        raise InputDataError(f"local DP needs integer value codes in [0, {d}), got {arr.dtype}")
    arr = np.ascontiguousarray(arr, dtype=np.int64).reshape(-1)
    if arr.size and (arr.min() < 0 or arr.max() >= d):
        bad = int(np.flatnonzero((arr < 0) | (arr >= d))[0])
        raise InputDataError(
            f"value code {int(arr[bad])} at position {bad} is outside the domain [0, {d})"
        )
    return arr


def _grr(codes: IntArray, p_keep: float, k: int, source: RandomSource) -> IntArray:
    """GRR over [0, k): keep with P ≤ p_keep, else a uniform *other* value."""
    n = codes.size
    keep = source.bernoulli(p_keep, n)
    other = source.integers(k - 1, n)
    other += other >= codes
    return np.where(keep, codes, other)


def _unary(codes: IntArray, par: OracleParameters, source: RandomSource) -> UInt8Array:
    """Unary encoding, chunked: other bits 1 w.p. ≥ q, the true bit 1 w.p. ≤ p."""
    n, d = codes.size, par.d
    out = np.empty((n, (d + 7) // 8), dtype=np.uint8)
    p_zero_other = 1.0 - par.q_other  # sample 0s for other bits: P[1] rounds *up* to ≥ q
    for start in range(0, n, CHUNK_ROWS):
        c = codes[start : start + CHUNK_ROWS]
        m = c.size
        ones = ~source.bernoulli(p_zero_other, m * d).reshape(m, d)
        ones[np.arange(m), c] = source.bernoulli(par.p_keep, m)
        out[start : start + m] = np.packbits(ones, axis=1)
    return out


def perturb(
    protocol: str, codes: npt.ArrayLike, epsilon: float, d: int, source: RandomSource
) -> Reports:
    """Client side: randomise each person's code into a report (ε-LDP per person)."""
    par = parameters(protocol, epsilon, d)
    c = _codes(codes, par.d)
    n = c.size
    if par.protocol in ("rr", "grr"):
        return Reports(par.protocol, par.epsilon, par.d, n, values=_grr(c, par.p_keep, d, source))
    if par.protocol in UNARY:
        return Reports(par.protocol, par.epsilon, par.d, n, bits=_unary(c, par, source))
    assert par.g is not None
    keys = source.words(n)
    hashed = keyed_hash(keys, c, par.g)
    reported = _grr(hashed, par.p_keep, par.g, source)
    return Reports(par.protocol, par.epsilon, par.d, n, values=reported, keys=keys, g=par.g)


def support_counts(reports: Reports) -> IntArray:
    """I_v for every v ∈ [0, d): how many reports support v. Sums across batches."""
    d = reports.d
    if reports.protocol in ("rr", "grr"):
        assert reports.values is not None
        return np.bincount(reports.values, minlength=d).astype(np.int64)
    if reports.protocol in UNARY:
        assert reports.bits is not None
        total = np.zeros(d, dtype=np.int64)
        for start in range(0, reports.n, CHUNK_ROWS):
            block = np.unpackbits(reports.bits[start : start + CHUNK_ROWS], axis=1, count=d)
            total += block.sum(axis=0, dtype=np.int64)
        return total
    assert reports.values is not None and reports.keys is not None and reports.g is not None
    out = np.zeros(d, dtype=np.int64)
    for start in range(0, reports.n, CHUNK_ROWS * 4):
        keys = reports.keys[start : start + CHUNK_ROWS * 4]
        y = reports.values[start : start + CHUNK_ROWS * 4]
        for v in range(d):  # a loop over the domain, vectorised over persons
            out[v] += np.count_nonzero(keyed_hash(keys, v, reports.g) == y)
    return out


# --------------------------------------------------------------------------- estimates

Z95 = NormalDist().inv_cdf(0.975)


@dataclass(frozen=True, eq=False)
class Estimates:
    """Unbiased count estimates for every value, with variance and normal-approx CIs.

    ``variance`` is the exact formula with the (clamped ≥ 0) estimate plugged in for the
    true count; ``table_variance`` the count-free REFERENCE.md value. ``halfwidth`` is
    z_{1−β/2}·√variance.
    """

    parameters: OracleParameters
    n: int
    support: IntArray
    counts: FloatArray
    variance: FloatArray
    table_variance: float
    halfwidth: FloatArray
    beta: float

    def to_frame(self) -> pd.DataFrame:
        """One row per value code: estimate, variance, CI (post-processing only)."""
        return pd.DataFrame(
            {
                "value": np.arange(self.parameters.d, dtype=np.int64),
                "estimate": self.counts,
                "variance": self.variance,
                "ci_low": self.counts - self.halfwidth,
                "ci_high": self.counts + self.halfwidth,
            }
        )


def estimate(
    protocol: str,
    epsilon: float,
    d: int,
    n: int,
    support: npt.ArrayLike,
    beta: float = 0.05,
) -> Estimates:
    """Unbiased counts ĉ(v) = (I_v − n·q*)/(p* − q*) from summed support counts."""
    par = parameters(protocol, epsilon, d)
    sup = np.asarray(support, dtype=np.int64).reshape(-1)
    if sup.shape != (par.d,):
        raise InputDataError(f"support counts must have length d = {par.d}, got {sup.shape}")
    p, q = par.p_star, par.q_star
    counts = ((sup - n * q) / (p - q)).astype(np.float64)
    base, var, half = _interval(par, float(n), counts, beta)
    return Estimates(par, int(n), sup, counts, var, base, half, beta)


def _interval(
    par: OracleParameters, n: float, counts: FloatArray, beta: float
) -> tuple[float, FloatArray, FloatArray]:
    """(count-free variance, per-value variance, half-width) at n reports: the exact
    n·q*(1−q*)/(p*−q*)² + ĉ·(1−p*−q*)/(p*−q*), ĉ clamped to [0, n]."""
    if not 0.0 < beta < 1.0:
        raise ConfigError(f"beta must lie strictly between 0 and 1, got {beta!r}")
    p, q = par.p_star, par.q_star
    base = n * q * (1.0 - q) / (p - q) ** 2
    var = np.maximum(base + np.clip(counts, 0.0, n) * (1.0 - p - q) / (p - q), 0.0)
    z = NormalDist().inv_cdf(1.0 - beta / 2.0)
    return base, var, np.asarray(z * np.sqrt(var), dtype=np.float64)


def public_halfwidth(
    parameters: OracleParameters, counts: npt.ArrayLike, beta: float = 0.05
) -> FloatArray:
    """Interval half-widths from the published estimates alone (post-processing).

    The exact variance needs n, the number of reports, which is the exact number of persons:
    an interval computed with it lets anyone solve for n from the published table (a
    membership oracle for whoever knows everyone else). Here n is replaced by
    n̂ = max(Σ_v ĉ_v, 0), an unbiased estimate of n from the estimates themselves, and each
    count term by ĉ_v clamped to [0, n̂]. (For rr/grr Σ_v ĉ_v = n exactly: those protocols'
    estimates state n themselves, which the release's guarantee says.)
    """
    est = np.asarray(counts, dtype=np.float64).reshape(-1)
    if est.shape != (parameters.d,):
        raise InputDataError(f"estimates must have length d = {parameters.d}, got {est.shape}")
    return _interval(parameters, max(float(est.sum()), 0.0), est, beta)[2]


def aggregate(reports: Reports, beta: float = 0.05) -> Estimates:
    """Server side: support counts of one batch of reports, then unbiased estimates."""
    return estimate(
        reports.protocol, reports.epsilon, reports.d, reports.n, support_counts(reports), beta
    )


# --------------------------------------------------------------------------- the oracle


@dataclass(frozen=True)
class FrequencyOracle:
    """One protocol at fixed (ε, d): a picklable handle for the pipeline's transforms."""

    protocol: str
    epsilon: float
    d: int

    @classmethod
    def create(cls, protocol: str, epsilon: float, d: int) -> FrequencyOracle:
        """Validated; ``protocol="auto"`` resolves with :func:`choose_protocol`."""
        if protocol == "auto":
            protocol = choose_protocol(epsilon, d)
        par = parameters(protocol, epsilon, d)
        return cls(par.protocol, par.epsilon, par.d)

    @property
    def parameters(self) -> OracleParameters:
        return parameters(self.protocol, self.epsilon, self.d)

    def perturb(self, codes: npt.ArrayLike, source: RandomSource) -> Reports:
        return perturb(self.protocol, codes, self.epsilon, self.d, source)

    def support_counts(self, reports: Reports) -> IntArray:
        self._check(reports)
        return support_counts(reports)

    def estimate(self, n: int, support: npt.ArrayLike, beta: float = 0.05) -> Estimates:
        return estimate(self.protocol, self.epsilon, self.d, n, support, beta)

    def aggregate(self, reports: Reports, beta: float = 0.05) -> Estimates:
        self._check(reports)
        return aggregate(reports, beta)

    def variance(self, n: int, count: float | None = None) -> float:
        return variance(self.protocol, n, self.epsilon, self.d, count)

    def _check(self, reports: Reports) -> None:
        if (reports.protocol, reports.epsilon, reports.d) != (self.protocol, self.epsilon, self.d):
            raise InputDataError(
                f"reports were made with {reports.protocol} at epsilon={reports.epsilon}, "
                f"d={reports.d}, not {self.protocol} at epsilon={self.epsilon}, d={self.d}"
            )


# --------------------------------------------------------------------------- tables

_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_UNHEX = np.full(256, 255, dtype=np.uint8)
_UNHEX[_HEX] = np.arange(16, dtype=np.uint8)
_UNHEX[np.frombuffer(b"ABCDEF", dtype=np.uint8)] = np.arange(10, 16, dtype=np.uint8)


def _to_hex(packed: UInt8Array) -> npt.NDArray[np.str_]:
    n, width = packed.shape
    chars = np.empty((n, 2 * width), dtype=np.uint8)
    chars[:, 0::2] = _HEX[packed >> 4]
    chars[:, 1::2] = _HEX[packed & 15]
    return chars.view(f"S{2 * width}").reshape(n).astype(f"U{2 * width}")


def _from_hex(col: pd.Series[Any], width: int) -> UInt8Array:
    try:
        raw = np.asarray(col.to_numpy(dtype=object), dtype=f"S{2 * width}")
    except (UnicodeEncodeError, ValueError, TypeError) as exc:
        raise InputDataError(f"column 'bits' must hold hex strings ({exc})") from exc
    lengths = np.char.str_len(raw)
    if raw.size and np.any(lengths != 2 * width):
        row = int(np.flatnonzero(lengths != 2 * width)[0])
        raise InputDataError(f"column 'bits' row {row}: expected {2 * width} hex digits")
    chars = raw.view(np.uint8).reshape(raw.size, 2 * width)
    nib = _UNHEX[chars]
    if np.any(nib == 255):
        row = int(np.flatnonzero((nib == 255).any(axis=1))[0])
        raise InputDataError(f"column 'bits' row {row} is not hexadecimal")
    return ((nib[:, 0::2] << 4) | nib[:, 1::2]).astype(np.uint8)


def reports_to_frame(reports: Reports) -> pd.DataFrame:
    """The reports as a table: ``report`` (rr/grr/blh/olh), ``key`` (int64 bits of the
    uint64 key; blh/olh) or ``bits`` (hex of the packed bit vector; sue/oue).

    ``frame.attrs`` carries protocol, epsilon, d and g; a CSV loses attrs, so
    :func:`reports_from_frame` also takes them as arguments.
    """
    cols: dict[str, Any] = {}
    if reports.keys is not None:
        cols["key"] = reports.keys.view(np.int64)
    if reports.values is not None:
        cols["report"] = reports.values
    if reports.bits is not None:
        cols["bits"] = _to_hex(reports.bits)
    frame = pd.DataFrame(cols)
    frame.attrs.update(protocol=reports.protocol, epsilon=reports.epsilon, d=reports.d, g=reports.g)
    return frame


def reports_from_frame(
    frame: pd.DataFrame,
    protocol: str | None = None,
    epsilon: float | None = None,
    d: int | None = None,
) -> Reports:
    """Reports read back from :func:`reports_to_frame`'s table, validated.

    Parameters not given are taken from ``frame.attrs``; given ones must agree with them.
    """
    given = {"protocol": protocol, "epsilon": epsilon, "d": d}
    vals: dict[str, Any] = {}
    for name, value in given.items():
        attr = frame.attrs.get(name)
        if value is None and attr is None:
            raise ConfigError(f"reports_from_frame needs {name} (not recorded in the table)")
        if value is not None and attr is not None and value != attr:
            raise InputDataError(f"the reports were made with {name}={attr!r}, not {value!r}")
        vals[name] = value if value is not None else attr
    par = parameters(str(vals["protocol"]), float(vals["epsilon"]), int(vals["d"]))
    n = len(frame)
    need = {"rr": ["report"], "grr": ["report"], "sue": ["bits"], "oue": ["bits"]}.get(
        par.protocol, ["key", "report"]
    )
    missing = [c for c in need if c not in frame.columns]
    if missing:
        raise InputDataError(f"{par.protocol} reports need column(s) {missing}")
    if par.protocol in UNARY:
        bits = _from_hex(frame["bits"], (par.d + 7) // 8)
        pad = (-par.d) % 8
        if pad and np.any(bits[:, -1] & np.uint8((1 << pad) - 1)):
            raise InputDataError("column 'bits' has bits set beyond the domain size d")
        return Reports(par.protocol, par.epsilon, par.d, n, bits=bits)
    report = _int_column(frame, "report")
    k = par.g if par.g is not None else par.d
    if report.size and (report.min() < 0 or report.max() >= k):
        row = int(np.flatnonzero((report < 0) | (report >= k))[0])
        raise InputDataError(f"column 'report' row {row} is outside [0, {k})")
    if par.g is None:
        return Reports(par.protocol, par.epsilon, par.d, n, values=report)
    keys = _int_column(frame, "key").view(np.uint64)
    return Reports(par.protocol, par.epsilon, par.d, n, values=report, keys=keys, g=par.g)


def _int_column(frame: pd.DataFrame, col: str) -> IntArray:
    arr = frame[col].to_numpy()
    if arr.dtype.kind not in "iu":
        raise InputDataError(f"column {col!r} must hold integers, got {arr.dtype}")
    return np.ascontiguousarray(arr.astype(np.int64, copy=False))
