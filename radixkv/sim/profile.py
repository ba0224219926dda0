"""A measured step-time profile: features of a step, the least-squares fit, the JSON file.

`radixkv calibrate` times a real executor's steps over a grid and fits, by non-negative least
squares on relative error (each row divided by its measured time, so a 3 ms decode step counts
as much as a 300 ms prefill; gross outliers set aside and counted), the step time as a linear form in the cost model's terms:

  t(step) = c_step                       per-step overhead (launches, plan, sampling setup)
          + c_seg    * B                 per-segment overhead (B sequences in the step)
          + c_linear * 2*P*T             matmul FLOPs of the T new tokens
          + c_attn   * A*pairs           attention FLOPs, exact (query, attended key) pairs
          + c_pad    * A*B*Q*C           attention FLOPs of the padded [B, Q, C] grid
          + c_read   * K*(sum p + sum c) cached KV read, exact
          + c_gather * K*B*C             KV gathered into the padded grid
          + c_spill  * K*B*C * [K*B*C/L > S]  the same bytes again once one layer's padded
                                         grid outgrows the cache: it streams from DRAM

with P, A, K as in radixkv.sim.costmodel (K per GPU, at the profile's dtype), L layers, Q =
the longest new run of any segment and C = the longest context (prefix + new) of any segment:
the layout of a padded-gather backend. A paged backend has no padding and its fit puts ~0 on
c_pad, c_gather and c_spill; coefficients are kept >= 0, so every term can only add time. KV
writes (K*T) are proportional to T for one model, so c_linear absorbs them.

S, the spill threshold, is fitted too (fit_spill): the per-layer padded-KV size, between two
measured steps, at which the fit is best; about the last-level cache on a CPU (on a 32 MiB-L3
EPYC a decode of 12 x 2k contexts runs at 1.6 ns per padded token, 12 x 4k at 3.1 ns). None:
no step spills (S = infinity).

What the linear form still misses at the measured steps is priced too (format 3): its ratio
to each uniform step of the grid, interpolated between them (radixkv.sim.ratio_grid),
multiplies it; the grid's mixed batches, in no table, are the held-out check. A format-2
profile prices by the linear form alone. No torch here: the timing harness lives in radixkv.offline.calibration.
"""
from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from radixkv.shapes import ModelArgs
from radixkv.sim.ratio_grid import RatioGrid, check_decode_at
from radixkv.sim.specs import ModelSpec

FEATURES = ("step", "segment", "linear_flops", "attn_flops", "padded_attn_flops",
            "kv_read_bytes", "padded_kv_bytes", "spilled_kv_bytes")
FORMAT = "radixkv-profile/3"
LINEAR_FORMAT = "radixkv-profile/2"        # still read: the linear form alone, no grid ratio
OLD_FORMATS = ("radixkv-profile/1",)
OUTLIER_FLOOR = 0.25


def spills(spec: ModelSpec, padded_kv_bytes: float, spill_bytes: float | None) -> bool:
    """Whether one layer's share of a step's padded KV grid is over the spill threshold."""
    return spill_bytes is not None and padded_kv_bytes / spec.model.n_layers > spill_bytes


def step_features(spec: ModelSpec, segments: Sequence[tuple[int, int]],
                  contexts: Sequence[int], spill_bytes: float | None = None) -> tuple[float, ...]:
    """The FEATURES of one step: prefill segments (prefix_len, new_len), decode contexts;
    `spill_bytes` the fitted threshold S (None: never)."""
    segs = list(segments) + [(c, 1) for c in contexts]
    if not segs:
        return (0.0,) * len(FEATURES)
    B = len(segs)
    T = sum(n for _, n in segs)
    pairs = sum(n * p + n * (n + 1) // 2 for p, n in segs)
    Q, C = max(n for _, n in segs), max(p + n for p, n in segs)
    A, K = spec.attn_flops_per_ctx_token, spec.kv_bytes_per_token_per_gpu
    padded = float(K * B * C)
    return (1.0, float(B), float(spec.flops_per_token * T), float(A * pairs),
            float(A * B * Q * C), float(K * sum(p for p, _ in segs)), padded,
            padded if spills(spec, padded, spill_bytes) else 0.0)


def nnls(a: np.ndarray, b: np.ndarray, iters: int = 200) -> np.ndarray:
    """min ||a x - b|| subject to x >= 0 (Lawson-Hanson active set)."""
    n = a.shape[1]
    x, passive = np.zeros(n), np.zeros(n, dtype=bool)
    for _ in range(iters):
        w = a.T @ (b - a @ x)
        if passive.all() or w[~passive].max() <= 1e-12:
            break
        passive[np.argmax(np.where(passive, -np.inf, w))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if z[passive].min() > 0:
                x = z
                break
            neg = passive & (z <= 0)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            passive &= x > 1e-15
    return x


@dataclass(frozen=True)
class Sample:
    """One timed step: its prefill segments, decode contexts and measured seconds (the median
    of its passes' times, when it was timed in several)."""
    segments: tuple[tuple[int, int], ...]
    contexts: tuple[int, ...]
    seconds: float
    passes: tuple[float, ...] = ()

    def __post_init__(self):
        if not (self.segments or self.contexts):
            raise ValueError("a profile sample needs at least one segment or decode")
        for v in (self.seconds, *self.passes):
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"a profile sample's seconds must be > 0, got {v!r}")

    @property
    def spread(self) -> float:
        """(slowest pass - fastest) / seconds: how far the machine's speed moved between
        passes at this step (0 for one pass)."""
        return (max(self.passes) - min(self.passes)) / self.seconds if self.passes else 0.0


@dataclass(frozen=True)
class Residuals:
    """Relative error (predicted / measured - 1) of the fit over the samples it kept."""
    rms: float
    max_abs: float
    median_abs: float
    samples: int              # samples the fit kept
    outliers: int = 0         # samples set aside (|error| > 4x the median, and > 25 %)


def fit(spec: ModelSpec, samples: Sequence[Sample],
        spill_bytes: float | None = None) -> tuple[dict[str, float], Residuals]:
    """Coefficients of FEATURES (seconds per unit, >= 0) and the fit's residuals, at spill
    threshold `spill_bytes` (None: no step spills, c_spill is 0)."""
    if len(samples) < len(FEATURES):
        raise ValueError(f"a fit needs at least {len(FEATURES)} samples, got {len(samples)}")
    x = np.array([step_features(spec, s.segments, s.contexts, spill_bytes) for s in samples])
    t = np.array([s.seconds for s in samples])
    keep = np.ones(len(t), dtype=bool)
    for _ in range(2):               # fit, set aside gross outliers (> 4x the median), refit
        a, tk = x[keep], t[keep]
        scale = np.maximum(np.abs(a / tk[:, None]).max(axis=0), 1e-300)   # unit-size columns
        coef = nnls(a / tk[:, None] / scale, np.ones(len(tk))) / scale
        rel = x @ coef / t - 1
        keep = np.abs(rel) <= max(OUTLIER_FLOOR, 4 * float(np.median(np.abs(rel))))
    kept = np.abs(rel[keep])
    return (dict(zip(FEATURES, map(float, coef))),
            Residuals(float(np.sqrt(np.mean(kept ** 2))), float(kept.max()),
                      float(np.median(kept)), int(keep.sum()), int((~keep).sum())))


def _linear(spec: ModelSpec, samples: Sequence[Sample], coef: dict[str, float],
            spill_bytes: float | None) -> np.ndarray:
    """The linear form's price of each sample [n]."""
    if not samples:
        return np.zeros(0)
    x = np.array([step_features(spec, s.segments, s.contexts, spill_bytes) for s in samples])
    return x @ np.array([coef[f] for f in FEATURES])


def _ratio_grid(spec: ModelSpec, samples: Sequence[Sample], coef: dict[str, float],
                spill_bytes: float | None, decode_at: str = "mean") -> RatioGrid:
    """The measured ratio to the linear form at the samples that are grid points."""
    on = [s for s in samples if RatioGrid.on_grid((s.segments, s.contexts))]
    lin = _linear(spec, on, coef, spill_bytes)
    keep = lin > 0
    return RatioGrid([(s.segments, s.contexts) for s, k in zip(on, keep) if k],
                     np.log(np.array([s.seconds for s in on])[keep] / lin[keep]), decode_at)


def held_out(spec: ModelSpec, samples: Sequence[Sample], coef: dict[str, float],
             spill_bytes: float | None, corrected: bool = True,
             decode_at: str = "mean") -> Residuals | None:
    """Relative error of the samples that are not grid points (mixed batches), priced by the
    linear form and, when `corrected`, the grid's ratio: how well steps off the grid are
    priced. None when every sample is a grid point."""
    off = [s for s in samples if not RatioGrid.on_grid((s.segments, s.contexts))]
    if not off:
        return None
    t = _linear(spec, off, coef, spill_bytes)
    if corrected:
        grid = _ratio_grid(spec, samples, coef, spill_bytes, decode_at)
        t = t * np.array([grid.factor(s.segments, s.contexts) for s in off])
    a = np.abs(t / np.array([s.seconds for s in off]) - 1)
    return Residuals(float(np.sqrt(np.mean(a ** 2))), float(a.max()), float(np.median(a)), len(a))


def fit_spill(spec: ModelSpec, samples: Sequence[Sample]
              ) -> tuple[dict[str, float], Residuals, float | None]:
    """fit() at the spill threshold that fits best: none, or the geometric mean of two
    consecutive per-layer padded-KV sizes of the samples (at least 2 samples above it). The
    best is the lowest rms over all samples, outliers counted, so a threshold cannot win by
    setting samples aside."""
    sizes = sorted({step_features(spec, s.segments, s.contexts)[6] / spec.model.n_layers
                    for s in samples})
    cands: list[float | None] = [None] + [math.sqrt(a * b) for a, b in zip(sizes, sizes[1:])
                                          if sum(w > a for w in sizes) >= 2]
    t = np.array([s.seconds for s in samples])
    best = None
    for cand in cands:
        coef, res = fit(spec, samples, cand)
        err = float(np.sqrt(np.mean((_linear(spec, samples, coef, cand) / t - 1) ** 2)))
        if best is None or err < best[0] - 1e-12:
            best = (err, coef, res, cand)
    return best[1], best[2], best[3]


@dataclass(frozen=True)
class Profile:
    """What `radixkv calibrate` measured: where, on what, the grid, the fit and its error."""
    model: ModelArgs
    dtype: str                      # torch dtype name, e.g. "float32"
    dtype_bytes: int
    device: str                     # "cpu" or "cuda"
    device_name: str
    backend: str                    # attention backend of the timed executor
    machine: dict
    grid: dict
    coefficients: dict[str, float]
    residuals: Residuals
    samples: tuple[Sample, ...] = field(default=(), repr=False)
    spill_bytes: float | None = None    # the fitted threshold S; None: no step spills
    corrected: bool = False             # priced with the grid's measured ratio (format 3)
    held_out: Residuals | None = None   # the mixed batches' error, priced as the profile prices
    decode_at: str = "mean"             # the context a decode batch's ratio is looked up at

    def __post_init__(self):
        if set(self.coefficients) != set(FEATURES):
            raise ValueError(f"profile coefficients must be exactly {', '.join(FEATURES)}; got "
                             f"{', '.join(sorted(self.coefficients))}")
        for k, v in self.coefficients.items():
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"profile coefficient {k} must be a finite number >= 0, got {v!r}")
        s = self.spill_bytes
        if s is not None and not (isinstance(s, (int, float)) and math.isfinite(s) and s > 0):
            raise ValueError(f"profile spill_bytes must be a finite number > 0 or null, got {s!r}")
        check_decode_at(self.decode_at, "profile")
        if self.corrected and not any(RatioGrid.on_grid((x.segments, x.contexts))
                                      for x in self.samples):
            raise ValueError("a profile priced by its grid's ratio needs its grid samples, and "
                             "has none")

    @property
    def model_spec(self) -> ModelSpec:
        return ModelSpec(self.model, tp=1, dtype_bytes=self.dtype_bytes)

    def cost_model(self, speed: float = 1.0) -> "ProfiledCostModel":
        return ProfiledCostModel(self, speed)

    def to_json(self) -> dict:
        return {"format": FORMAT, "model": asdict(self.model), "dtype": self.dtype,
                "dtype_bytes": self.dtype_bytes, "device": self.device,
                "device_name": self.device_name, "backend": self.backend,
                "machine": self.machine, "grid": self.grid, "form": "t = sum(coef * feature)",
                "coefficients": self.coefficients, "spill_bytes": self.spill_bytes,
                "residuals": asdict(self.residuals),
                "correction": {"kind": "grid-ratio", "decode_at": self.decode_at,
                               "held_out": None if self.held_out is None
                               else asdict(self.held_out)} if self.corrected else None,
                "samples": [{"segments": [list(s) for s in x.segments],
                             "contexts": list(x.contexts), "seconds": x.seconds,
                             **({"passes": list(x.passes)} if x.passes else {})}
                            for x in self.samples]}

    @classmethod
    def from_json(cls, doc: dict, where: str = "profile") -> "Profile":
        if isinstance(doc, dict) and doc.get("format") in OLD_FORMATS:
            raise ValueError(f"{where}: format {doc['format']!r} is an older profile without "
                             f"the spilled_kv_bytes term; re-run `radixkv calibrate` "
                             f"(want {FORMAT!r})")
        if not isinstance(doc, dict) or doc.get("format") not in (FORMAT, LINEAR_FORMAT):
            got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
            raise ValueError(f"{where}: not a radixkv profile (format {got!r}, want {FORMAT!r})")
        try:
            cor = doc["correction"] if doc["format"] == FORMAT else None
            if cor is not None and (not isinstance(cor, dict) or cor.get("kind") != "grid-ratio"):
                raise TypeError(f"correction must be null or of kind 'grid-ratio', got {cor!r}")
            held = None if cor is None or cor.get("held_out") is None else \
                Residuals(**cor["held_out"])
            margs = doc["model"]
            if "rope_scaling" in margs and margs["rope_scaling"] is not None:
                margs = {**margs, "rope_scaling": tuple(margs["rope_scaling"])}
            return cls(model=ModelArgs(**margs), dtype=str(doc["dtype"]),
                       dtype_bytes=int(doc["dtype_bytes"]), device=str(doc["device"]),
                       device_name=str(doc["device_name"]), backend=str(doc["backend"]),
                       machine=dict(doc["machine"]), grid=dict(doc["grid"]),
                       coefficients=dict(doc["coefficients"]), spill_bytes=doc["spill_bytes"],
                       residuals=Residuals(**doc["residuals"]),
                       samples=tuple(Sample(tuple((int(p), int(n)) for p, n in s["segments"]),
                                            tuple(int(c) for c in s["contexts"]),
                                            float(s["seconds"]),
                                            tuple(float(v) for v in s.get("passes", ())))
                                     for s in doc.get("samples", ())),
                       corrected=cor is not None, held_out=held,
                       decode_at=str((cor or {}).get("decode_at", "mean")))
        except (KeyError, TypeError) as e:
            raise ValueError(f"{where}: malformed profile ({type(e).__name__}: {e})") from None

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1, allow_nan=False) + "\n")


def load_profile(path: str | Path, model: str | None = None) -> Profile:
    """The profile at `path`; `model`, when given, must be the model it was measured on."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"profile {str(p)!r} does not exist")
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"profile {str(p)!r} is not valid JSON ({e})") from None
    prof = Profile.from_json(doc, f"profile {str(p)!r}")
    if model is not None and model != prof.model.name:
        raise ValueError(f"profile {str(p)!r} was measured on model {prof.model.name!r}, "
                         f"not {model!r}")
    return prof


@dataclass(frozen=True)
class ProfiledCostModel:
    """CostModel's step-time interface priced from a Profile (one device, tp 1)."""
    profile: Profile
    speed: float = 1.0           # every step takes this times the profile's time
    model_spec: ModelSpec = field(init=False)
    _coef: tuple[float, ...] = field(init=False, repr=False)
    _ratio: RatioGrid | None = field(init=False, repr=False)

    def __post_init__(self):
        p = self.profile
        if not (isinstance(self.speed, (int, float)) and math.isfinite(self.speed)
                and self.speed > 0):
            raise ValueError(f"a profile's speed factor must be a finite number > 0, got "
                             f"{self.speed!r}")
        object.__setattr__(self, "model_spec", p.model_spec)
        object.__setattr__(self, "_coef", tuple(p.coefficients[f] for f in FEATURES))
        object.__setattr__(self, "_ratio", _ratio_grid(
            p.model_spec, p.samples, p.coefficients, p.spill_bytes, p.decode_at)
            if p.corrected else None)

    @property
    def label(self) -> str:
        p = self.profile
        at = "" if self.speed == 1.0 else f" x{self.speed:.3g}"
        return f"{p.model.name}@{p.device}:{p.device_name} (profile{at})"

    @property
    def device_name(self) -> str:
        return self.profile.device_name

    @property
    def timing(self) -> str:
        """What prices the steps, as every output's metadata names it."""
        return f"profile: measured on {self.profile.device}:{self.profile.device_name}"

    def step_time(self, prefill_segments: Sequence[tuple[int, int]] = (),
                  decode_context_lens: Sequence[int] = ()) -> float:
        """Seconds of one engine step; 0.0 for an empty step."""
        f = step_features(self.model_spec, prefill_segments, decode_context_lens,
                          self.profile.spill_bytes)
        t = sum(c * x for c, x in zip(self._coef, f)) * self.speed
        if self._ratio is None or not t:
            return t
        return t * self._ratio.factor(prefill_segments, decode_context_lens)

    def decode_step_time(self, batch: int, ctx_sum: int, ctx_max: int) -> float:
        """step_time((), contexts) from len, sum and max of the contexts, to the bit: each
        decode is the segment (c, 1)."""
        spec = self.model_spec
        a, k = spec.attn_flops_per_ctx_token, spec.kv_bytes_per_token_per_gpu
        padded = float(k * batch * (ctx_max + 1))
        f = (1.0, float(batch), float(spec.flops_per_token * batch), float(a * (ctx_sum + batch)),
             float(a * batch * (ctx_max + 1)), float(k * ctx_sum), padded,
             padded if spills(spec, padded, self.profile.spill_bytes) else 0.0)
        t = sum(c * x for c, x in zip(self._coef, f)) * self.speed
        if self._ratio is None or not t:
            return t
        return t * self._ratio.decode_factor(batch, ctx_sum, ctx_max)

    def prefill_time(self, segments: Sequence[tuple[int, int]]) -> float:
        return self.step_time(segments, ())

    def recompute_s(self, depth: int, n: int) -> float:
        """Seconds of n tokens' prefill after depth cached ones (the `cost` eviction order)."""
        return self.step_time([(depth, n)], ())

    def decode_time(self, context_lens: Sequence[int]) -> float:
        return self.step_time((), context_lens)


