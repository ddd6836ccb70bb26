"""Statistics for comparing sweep arms over a handful of seeds.

    from ragen2_core.report import stats

    est = stats.mean_ci([0.2, 0.5, 0.6])          # Estimate(value, low, high, n, method)
    stats.fmt_ci(est)                             # "0.433 [0.200, 0.567]"; never "nan"
    stats.iqm([0, 1, 2, 3, 4, 100, 5, 6])         # 3.5
    stats.stratified_iqm_ci([[...], [...]])       # IQM over all runs, runs resampled within each condition
    stats.diff_ci(x, y), stats.interaction_ci(a, b, c, d)   # a - b against c - d
    stats.permutation_p(x, y), stats.spearman_ci(x, y), stats.holm(ps), stats.bh(ps)
    stats.probability_of_improvement([x_cond1, ...], [y_cond1, ...])
    stats.performance_profile(scores, taus)

The computations are scipy's (`bootstrap`, `permutation_test`, `spearmanr`, `mannwhitneyu`,
`trim_mean`, `false_discovery_control`); this module decides what to do at the edges, where a
report must still say something true:

* n = 0: no value; n = 1: a value and no interval; all values equal: a zero-width interval
  ("all equal"), because BCa divides by the jackknife spread and returns NaN there.
* "auto" intervals: BCa from 10 values up, percentile below (BCa's corrections are unstable on a
  few atoms). When BCa cannot be computed (NaN) the percentile interval is used and the method
  string says so. Every interval carries its method name, so the PDF can print it.
* With 3 seeds there are only 10 distinct bootstrap resamples: any bootstrap interval is too
  narrow (it undercovers). `few_seeds_note` says so in the report rather than hiding it.
Probability of improvement, IQM, stratified bootstrap and performance profiles follow rliable
(Agarwal et al. 2021, "Deep RL at the edge of the statistical precipice").
"""
from __future__ import annotations

import itertools
import math
import warnings
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np
from scipy import stats as sps

LEVEL = 0.95
RESAMPLES = 2000
SEED = 0  # intervals in a report must not change between two builds of the same data
BCA_MIN_N = 10  # below this, "auto" intervals are percentile (see choose)
DASH = "–"  # printed wherever a number does not exist; NaN is never printed


@dataclass
class Estimate:
    value: Optional[float]
    low: Optional[float]
    high: Optional[float]
    n: int
    method: str

    def as_dict(self, prefix: str = "") -> dict:
        return {f"{prefix}value": self.value, f"{prefix}low": self.low, f"{prefix}high": self.high,
                f"{prefix}n": self.n, f"{prefix}method": self.method}


def clean(values) -> np.ndarray:
    """Finite floats only: NaN / inf / None are missing values, not numbers."""
    arr = np.asarray([np.nan if v is None else v for v in values], dtype=float).ravel()
    return arr[np.isfinite(arr)]


def _num(x) -> Optional[float]:
    return float(x) if x is not None and np.isfinite(x) else None


def _quiet(fn: Callable, *args, **kwargs):
    # scipy warns (DegenerateDataWarning, divide-by-zero) exactly in the cases handled here.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with np.errstate(all="ignore"):
            return fn(*args, **kwargs)


# ----------------------------------------------------------------------------- one-sample intervals

def choose(method: str, n: int) -> str:
    """"auto": BCa from BCA_MIN_N values up, percentile below. With a handful of seeds the bootstrap
    distribution is a few atoms, many of them tied with the estimate; BCa's bias correction then
    depends on how floating point breaks those ties (3 symmetric seeds gave a lopsided interval)."""
    return method if method != "auto" else ("BCa" if n >= BCA_MIN_N else "percentile")


def bootstrap_ci(values, statistic: Callable = np.mean, *, method: str = "auto", level: float = LEVEL,
                 n_resamples: int = RESAMPLES, seed: int = SEED) -> Estimate:
    """`statistic` (vectorised over `axis`) of `values` with a bootstrap interval over them."""
    x = clean(values)
    method = choose(method, len(x))
    n = len(x)
    if n == 0:
        return Estimate(None, None, None, 0, "no data")
    value = float(statistic(x, axis=-1))
    if n == 1:
        return Estimate(value, None, None, 1, "n=1: no interval")
    if np.ptp(x) == 0:
        return Estimate(value, value, value, n, "all equal: zero-width interval")
    res = _quiet(sps.bootstrap, (x,), statistic, method=method, confidence_level=level,
                 n_resamples=n_resamples, rng=np.random.default_rng(seed), vectorized=True)
    low, high = res.confidence_interval
    if np.isfinite(low) and np.isfinite(high):
        return Estimate(value, float(low), float(high), n, f"{method} bootstrap")
    res = _quiet(sps.bootstrap, (x,), statistic, method="percentile", confidence_level=level,
                 n_resamples=n_resamples, rng=np.random.default_rng(seed), vectorized=True)
    low, high = res.confidence_interval
    return Estimate(value, _num(low), _num(high), n, f"percentile bootstrap ({method} undefined)")


def mean_ci(values, **kw) -> Estimate:
    return bootstrap_ci(values, np.mean, **kw)


def t_ci(values, level: float = LEVEL) -> Estimate:
    """Student-t interval of the mean: exact under normal noise, and wide enough at n=3 to be honest
    where every bootstrap interval is too narrow. Shown beside the bootstrap one, not instead."""
    x = clean(values)
    n = len(x)
    if n < 2:
        return Estimate(float(x.mean()) if n else None, None, None, n, "n<2: no interval")
    m, se = float(x.mean()), float(sps.sem(x))
    if se == 0:
        return Estimate(m, m, m, n, "all equal: zero-width interval")
    low, high = sps.t.interval(level, n - 1, loc=m, scale=se)
    return Estimate(m, float(low), float(high), n, "Student t")


def iqm(values) -> Optional[float]:
    """Interquartile mean: mean of the middle 50 % (scipy trim_mean, 25 % cut from each end)."""
    x = clean(values)
    return float(sps.trim_mean(x, 0.25)) if len(x) else None


def wilson_ci(successes: int, n: int, level: float = LEVEL) -> Estimate:
    """Wilson score interval of a proportion: stays inside [0, 1] and keeps its coverage near 0 and
    1, where the normal (Wald) interval collapses to zero width."""
    if n == 0:
        return Estimate(None, None, None, 0, "n=0: no interval")
    z = float(sps.norm.ppf(0.5 + level / 2))
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return Estimate(p, max(0.0, centre - half), min(1.0, centre + half), n, "Wilson score")


def proportion_diff_ci(k1: int, n1: int, k2: int, n2: int, level: float = LEVEL) -> Estimate:
    """p1 - p2 of two independent proportions with Newcombe's hybrid score interval (his method 10:
    each proportion's Wilson interval, combined), which behaves where the Wald difference does not."""
    if not n1 or not n2:
        return Estimate(None, None, None, min(n1, n2), "a group is empty: no interval")
    a, b = wilson_ci(k1, n1, level), wilson_ci(k2, n2, level)
    d = a.value - b.value
    low = d - math.sqrt((a.value - a.low) ** 2 + (b.high - b.value) ** 2)
    high = d + math.sqrt((a.high - a.value) ** 2 + (b.value - b.low) ** 2)
    return Estimate(d, low, high, n1 + n2, "Newcombe hybrid score")


def min_detectable_difference(sd: float, n_per_arm: int, *, alpha: float = 0.05, power: float = 0.8,
                              t: bool = False, cells: int = 2) -> float:
    """Smallest true difference of two arms' means that a two-sided level-``alpha`` test of ``n_per_arm``
    trials each detects with probability ``power``, for a per-trial SD ``sd``:
    (q_{1-alpha/2} + q_{power}) * sd * sqrt(2 / n), with normal quantiles, or with ``t`` Student-t
    quantiles on 2n - 2 degrees of freedom (the usual small-sample correction: the test run on the
    results is a t-test, not a z-test).
    ``cells=4``: the same for a difference of two differences (interaction_ci), four cells of n each:
    its standard error is sd * sqrt(4 / n), sqrt(2) times a plain difference's, on 4n - 4 df."""
    if t:
        df = cells * (n_per_arm - 1)
        if df < 1:
            return math.inf
        q = sps.t.ppf(1 - alpha / 2, df) + sps.t.ppf(power, df)
    else:
        q = sps.norm.ppf(1 - alpha / 2) + sps.norm.ppf(power)
    return float(q * sd * math.sqrt(cells / n_per_arm))


def _iqm_axis(*samples, axis=-1):
    return sps.trim_mean(np.concatenate(samples, axis=axis), 0.25, axis=axis)


def stratified_iqm_ci(strata: Sequence[Sequence[float]], *, level: float = LEVEL,
                      n_resamples: int = RESAMPLES, seed: int = SEED) -> Estimate:
    """IQM over the runs of all strata (conditions); runs are resampled within each stratum, so
    every resample keeps the sweep's design. Percentile interval, as in rliable."""
    groups = [clean(s) for s in strata]
    groups = [g for g in groups if len(g)]
    n = sum(len(g) for g in groups)
    if n == 0:
        return Estimate(None, None, None, 0, "no data")
    value = float(_iqm_axis(*groups))
    usable = [g for g in groups if len(g) > 1]  # a stratum of one run has nothing to resample
    if n == 1 or not usable or np.ptp(np.concatenate(groups)) == 0:
        how = "all equal: zero-width interval" if n > 1 else "n=1: no interval"
        return Estimate(value, value if n > 1 else None, value if n > 1 else None, n, how)
    fixed = [g for g in groups if len(g) == 1]
    stat = (lambda *s, axis=-1: _iqm_axis(*s, *[np.broadcast_to(f, s[0].shape[:-1] + (1,)) for f in fixed],
                                          axis=axis))
    res = _quiet(sps.bootstrap, tuple(usable), stat, method="percentile", confidence_level=level,
                 n_resamples=n_resamples, rng=np.random.default_rng(seed), vectorized=True)
    low, high = res.confidence_interval
    note = f", {len(fixed)} single-run stratum held fixed" if fixed else ""
    return Estimate(value, _num(low), _num(high), n, f"stratified percentile bootstrap{note}")


# ----------------------------------------------------------------------------- two samples

def _mean_diff(x, y, axis=-1):
    return np.mean(x, axis=axis) - np.mean(y, axis=axis)


def diff_ci(x, y, *, method: str = "auto", level: float = LEVEL, n_resamples: int = RESAMPLES,
            seed: int = SEED) -> Estimate:
    """mean(x) - mean(y), each sample resampled on its own (independent seeds)."""
    return _independent_ci((x, y), _mean_diff, "an arm", method=method, level=level,
                           n_resamples=n_resamples, seed=seed)


def _diff_of_diffs(a, b, c, d, axis=-1):
    return _mean_diff(a, b, axis) - _mean_diff(c, d, axis)


def interaction_ci(a, b, c, d, *, method: str = "auto", level: float = LEVEL, n_resamples: int = RESAMPLES,
                   seed: int = SEED) -> Estimate:
    """(mean(a) - mean(b)) - (mean(c) - mean(d)): how much an effect (a against b) differs from the
    same effect under another condition (c against d), e.g. a filter's gain at slip 0.5 minus its
    gain at slip 0. Four cells of independent seeds, each resampled on its own."""
    return _independent_ci((a, b, c, d), _diff_of_diffs, "a cell", method=method, level=level,
                           n_resamples=n_resamples, seed=seed)


def _independent_ci(samples, statistic: Callable, unit: str, *, method: str, level: float, n_resamples: int,
                    seed: int) -> Estimate:
    """`statistic` of several independent samples with a bootstrap interval resampling each one."""
    xs = [clean(s) for s in samples]
    n = sum(len(x) for x in xs)
    if any(len(x) == 0 for x in xs):
        return Estimate(None, None, None, n, f"no data in {unit}")
    method = choose(method, min(len(x) for x in xs))
    value = float(statistic(*xs))
    if any(len(x) < 2 for x in xs):
        return Estimate(value, None, None, n, f"{unit} has n=1: no interval")
    if all(np.ptp(x) == 0 for x in xs):
        return Estimate(value, value, value, n, f"all equal within each {unit.split()[-1]}: zero-width interval")
    for how in (method, "percentile"):
        res = _quiet(sps.bootstrap, tuple(xs), statistic, method=how, confidence_level=level,
                     n_resamples=n_resamples, rng=np.random.default_rng(seed), vectorized=True)
        low, high = res.confidence_interval
        if np.isfinite(low) and np.isfinite(high):
            name = f"{how} bootstrap" if how == method else f"percentile bootstrap ({method} undefined)"
            return Estimate(value, float(low), float(high), n, name)
    return Estimate(value, None, None, n, "bootstrap undefined")


def permutation_p(x, y, *, n_resamples: int = 9999, seed: int = SEED) -> Optional[float]:
    """Two-sided permutation test of mean(x) - mean(y); exact when the partitions are few."""
    a, b = clean(x), clean(y)
    if len(a) == 0 or len(b) == 0:
        return None
    if np.ptp(np.concatenate([a, b])) == 0:
        return 1.0  # every relabelling gives the same difference: no evidence at all
    if min(len(a), len(b)) == 1:
        return _exact_permutation_p(a, b)  # scipy refuses a sample of one; its partitions are few
    exact = math.comb(len(a) + len(b), len(a)) <= n_resamples
    res = _quiet(sps.permutation_test, (a, b), _mean_diff, permutation_type="independent",
                 vectorized=True, alternative="two-sided", n_resamples=np.inf if exact else n_resamples,
                 rng=np.random.default_rng(seed))
    return float(res.pvalue)


def _exact_permutation_p(a: np.ndarray, b: np.ndarray) -> float:
    """Every split of the pooled values into groups of len(a) and len(b); two-sided as scipy's
    permutation_test defines it: twice the smaller tail, ties (to its relative 1e-14) counted in."""
    pooled = np.concatenate([a, b])
    observed = a.mean() - b.mean()
    null = np.array([pooled[list(idx)].mean() - np.delete(pooled, list(idx)).mean()
                     for idx in itertools.combinations(range(len(pooled)), len(a))])
    gamma = abs(1e-14 * observed)
    return float(min(1.0, 2 * min(np.mean(null >= observed - gamma), np.mean(null <= observed + gamma))))


def smallest_p(n_x: int, n_y: int) -> Optional[float]:
    """The smallest two-sided p an exact permutation test can give for these sample sizes:
    2 / C(n_x + n_y, n_x). With 3 vs 3 seeds that is 0.1, so 0.05 is out of reach."""
    if n_x == 0 or n_y == 0:
        return None
    return min(1.0, 2 / math.comb(n_x + n_y, n_x))


def spearman_ci(x, y, *, level: float = LEVEL, n_resamples: int = RESAMPLES, seed: int = SEED) -> dict:
    """Spearman rho of paired (x, y), its p-value, and a paired percentile bootstrap interval.

    Resamples with a constant x or y have no rank correlation; they are dropped from the
    bootstrap distribution and counted in the method string."""
    pairs = np.asarray([(a, b) for a, b in zip(x, y) if _num(a) is not None and _num(b) is not None], float)
    n = len(pairs)
    empty = {"rho": None, "p": None, "low": None, "high": None, "n": n}
    if n < 3:
        return empty | {"method": f"n={n}: too few trials"}
    a, b = pairs[:, 0], pairs[:, 1]
    if np.ptp(a) == 0 or np.ptp(b) == 0:
        return empty | {"method": "a constant variable: no rank correlation"}
    r = _quiet(sps.spearmanr, a, b)
    res = _quiet(sps.bootstrap, (a, b), lambda u, v: sps.spearmanr(u, v).statistic, paired=True,
                 vectorized=False, method="percentile", confidence_level=level, n_resamples=n_resamples,
                 rng=np.random.default_rng(seed))
    dist = np.asarray(res.bootstrap_distribution, float)
    ok = dist[np.isfinite(dist)]
    tail = (1 - level) / 2 * 100
    low, high = (np.percentile(ok, [tail, 100 - tail]) if len(ok) else (None, None))
    dropped = len(dist) - len(ok)
    method = "paired percentile bootstrap" + (f" ({dropped} of {len(dist)} constant resamples dropped)"
                                              if dropped else "")
    return {"rho": _num(r.statistic), "p": _num(r.pvalue), "low": _num(low), "high": _num(high),
            "n": n, "method": method}


# ----------------------------------------------------------------------------- multiple comparisons

def holm(pvalues: Sequence[Optional[float]]) -> list[Optional[float]]:
    """Holm-Bonferroni adjusted p-values (family-wise error), input order kept; None stays None.

    Sorted ascending, the k-th smallest (0-based) is multiplied by (m - k); a running maximum
    keeps the adjusted values monotone; capped at 1. scipy has no Holm, hence this."""
    idx = [i for i, p in enumerate(pvalues) if p is not None and np.isfinite(p)]
    out: list[Optional[float]] = [None] * len(pvalues)
    m, running = len(idx), 0.0
    for k, i in enumerate(sorted(idx, key=lambda i: pvalues[i])):
        running = max(running, min(1.0, (m - k) * pvalues[i]))
        out[i] = running
    return out


def bh(pvalues: Sequence[Optional[float]]) -> list[Optional[float]]:
    """Benjamini-Hochberg q-values (false discovery rate) by scipy; None stays None."""
    idx = [i for i, p in enumerate(pvalues) if p is not None and np.isfinite(p)]
    out: list[Optional[float]] = [None] * len(pvalues)
    if idx:
        q = sps.false_discovery_control([pvalues[i] for i in idx], method="bh")
        for i, v in zip(idx, q):
            out[i] = float(v)
    return out


# ----------------------------------------------------------------------------- rliable aggregates

def _poi(x, y) -> float:
    """P(a random run of x beats a random run of y), ties counting one half: Mann-Whitney U / (n m)."""
    return sps.mannwhitneyu(x, y, alternative="greater").statistic / (len(x) * len(y))


def probability_of_improvement(x_strata: Sequence[Sequence[float]], y_strata: Sequence[Sequence[float]], *,
                               level: float = LEVEL, n_resamples: int = RESAMPLES, seed: int = SEED) -> Estimate:
    """rliable's P(X > Y): the per-condition probability averaged over conditions, with a
    stratified percentile bootstrap (both arms' runs resampled within each condition)."""
    pairs = [(clean(a), clean(b)) for a, b in zip(x_strata, y_strata)]
    pairs = [(a, b) for a, b in pairs if len(a) and len(b)]
    n = sum(len(a) + len(b) for a, b in pairs)
    if not pairs:
        return Estimate(None, None, None, 0, "no condition with runs in both arms")
    value = float(np.mean([_poi(a, b) for a, b in pairs]))
    if all(len(a) < 2 or len(b) < 2 for a, b in pairs):
        return Estimate(value, None, None, n, "n=1 per arm: no interval")
    rng = np.random.default_rng(seed)
    per_condition = []
    for a, b in pairs:  # the same U / (n m), vectorised over resamples: (R, n, 1) against (R, 1, m)
        ra = a[rng.integers(0, len(a), (n_resamples, len(a)))][:, :, None]
        rb = b[rng.integers(0, len(b), (n_resamples, len(b)))][:, None, :]
        per_condition.append(((ra > rb) + 0.5 * (ra == rb)).mean(axis=(1, 2)))
    boots = np.mean(per_condition, axis=0)
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(boots, [tail, 100 - tail])
    return Estimate(value, float(low), float(high), n, "stratified percentile bootstrap")


def performance_profile(scores: Sequence[float], taus: Sequence[float], *, level: float = LEVEL,
                        n_resamples: int = RESAMPLES, seed: int = SEED) -> dict:
    """Fraction of runs with score > tau for each tau, with a percentile bootstrap band over runs."""
    x = clean(scores)
    t = np.asarray(taus, float)
    if len(x) == 0:
        return {"tau": t, "frac": None, "low": None, "high": None, "n": 0}
    frac = (x[:, None] > t[None, :]).mean(axis=0)
    rng = np.random.default_rng(seed)
    draws = x[rng.integers(0, len(x), size=(n_resamples, len(x)))]
    boots = (draws[:, :, None] > t[None, None, :]).mean(axis=1)
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(boots, [tail, 100 - tail], axis=0)
    return {"tau": t, "frac": frac, "low": low, "high": high, "n": len(x)}


# ----------------------------------------------------------------------------- printing

def fmt(x, digits: int = 3) -> str:
    """A number for the PDF; the dash for anything that is not a finite number."""
    if x is None or isinstance(x, str):
        return DASH if x is None else x
    x = float(x)
    if not math.isfinite(x):
        return DASH
    if abs(x) >= 10 ** 4:
        return f"{x:,.0f}"
    text = f"{x:.{digits}f}"
    return text.lstrip("-") if float(text) == 0 else text  # a rounding residue is no negative sign


def fmt_ci(est: Estimate, digits: int = 3) -> str:
    if est.value is None:
        return DASH
    if est.low is None or est.high is None:
        return fmt(est.value, digits)
    return f"{fmt(est.value, digits)} [{fmt(est.low, digits)}, {fmt(est.high, digits)}]"


def fmt_p(p: Optional[float]) -> str:
    if p is None or not math.isfinite(p):
        return DASH
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def few_seeds_note(n: int) -> str:
    if n >= 10:
        return ""
    distinct = math.comb(2 * n - 1, n) if n > 0 else 0
    return (f"With n={n} seeds a bootstrap resamples only {distinct} distinct seed multisets: "
            "its intervals are too narrow and describe the seeds seen rather than guarantee 95 % coverage.")
