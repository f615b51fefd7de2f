"""`connect-coordinator bench compare`: the verdict of an alternating A/B from its JSON files.

Give the `--json` outputs of the same benchmark run alternately against two versions, in the
order they ran (`--a A1 A2 ...`, `--b B1 B2 ...`: A1 ran next to B1, A2 next to B2, ...).
For each figure (a dotted path into the JSON, e.g. `in_flight.p99_ratio`; by default every
number that all the files have) it prints:

* each side's median and spread (min-max);
* B / A of the medians, and B / A **pair by pair** (the median of the pairs' ratios: a pair
  ran at about the same time, so what the machine was doing then weighs on both sides);
* a 95% interval for the pair-by-pair ratio, by resampling the pairs (bootstrap), and in
  how many pairs B was lower;
* the verdict: `B higher` or `B lower` when the interval leaves out 1.0, else `within noise`.

A single run of a latency benchmark on a shared machine moves by a fifth or more by chance
alone; the interval says how far the median of these pairs can be trusted, so that two
versions are not called different (or equal) on a handful of lucky runs.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

DEFAULT_DRAWS = 2_000
DEFAULT_SEED = 1  # the same files always give the same interval


class CompareError(Exception):
    """Bad input: a file, a figure or the pairing; told in one line."""


@dataclass(frozen=True, slots=True)
class Comparison:
    figure: str
    pairs: int
    a_median: float
    a_min: float
    a_max: float
    b_median: float
    b_min: float
    b_max: float
    medians_ratio: float | None  # B's median / A's median
    pair_ratio: float | None  # median of B / A, pair by pair
    interval: tuple[float, float] | None  # 95% bootstrap interval of `pair_ratio`
    b_lower: int  # pairs in which B's figure was lower than A's
    verdict: str


def numeric_leaves(value: Any, prefix: str = "") -> Iterator[tuple[str, float]]:
    """(dotted path, number) for every int or float in a JSON document (not booleans)."""
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from numeric_leaves(inner, f"{prefix}{key}.")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        if math.isfinite(value):
            yield prefix[:-1], float(value)


def figure_of(document: Any, path: str) -> float | None:
    """The number at dotted `path`, or None if there is none."""
    value = document
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def bootstrap_interval(ratios: Sequence[float], draws: int, seed: int
                       ) -> tuple[float, float]:
    """The 2.5th and 97.5th percentiles of the median of `ratios` resampled with
    replacement `draws` times."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios)))
                     for _ in range(draws))
    low = medians[int(0.025 * (draws - 1))]
    high = medians[int(math.ceil(0.975 * (draws - 1)))]
    return low, high


def compare(a: Sequence[float], b: Sequence[float], figure: str = "",
            draws: int = DEFAULT_DRAWS, seed: int = DEFAULT_SEED) -> Comparison:
    """A/B verdict for one figure; `a[i]` and `b[i]` ran as a pair."""
    if len(a) != len(b):
        raise CompareError(f"{figure or 'figure'}: {len(a)} A values but {len(b)} B values")
    if len(a) < 2:
        raise CompareError(f"{figure or 'figure'}: at least 2 pairs are needed, got {len(a)}")
    ratios = [y / x for x, y in zip(a, b, strict=True) if x]  # a zero A has no ratio
    a_median, b_median = statistics.median(a), statistics.median(b)
    interval = bootstrap_interval(ratios, draws, seed) if len(ratios) >= 2 else None
    if interval is None:
        verdict = "too few pairs"
    elif interval[0] > 1.0:
        verdict = "B higher"
    elif interval[1] < 1.0:
        verdict = "B lower"
    else:
        verdict = "within noise"
    return Comparison(
        figure=figure, pairs=len(a),
        a_median=a_median, a_min=min(a), a_max=max(a),
        b_median=b_median, b_min=min(b), b_max=max(b),
        medians_ratio=b_median / a_median if a_median else None,
        pair_ratio=statistics.median(ratios) if ratios else None,
        interval=interval,
        b_lower=sum(y < x for x, y in zip(a, b, strict=True)),
        verdict=verdict)


def load(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except OSError as error:
        raise CompareError(f"{path}: cannot read it ({error.strerror or error})") from error
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CompareError(f"{path}: not a JSON document ({error})") from error


def compare_files(a_files: Sequence[Path], b_files: Sequence[Path],
                  figures: Sequence[str] = (), draws: int = DEFAULT_DRAWS,
                  seed: int = DEFAULT_SEED) -> list[Comparison]:
    """One Comparison per figure: the named ones (each must be a number in every file), or
    every number all the files have, in the first file's order."""
    if len(a_files) != len(b_files):
        raise CompareError(f"{len(a_files)} A files but {len(b_files)} B files: "
                           "give them in pairs, in the order they ran")
    a_docs = [load(path) for path in a_files]
    b_docs = [load(path) for path in b_files]
    paths, documents = [*a_files, *b_files], [*a_docs, *b_docs]
    if not figures:
        figures = [figure for figure, _ in numeric_leaves(a_docs[0] if a_docs else {})
                   if all(figure_of(document, figure) is not None for document in documents)]
        if not figures:
            raise CompareError("the files have no number in common")
    results = []
    for figure in figures:
        values = []
        for path, document in zip(paths, documents, strict=True):
            value = figure_of(document, figure)
            if value is None:
                raise CompareError(f"{path}: no number at {figure!r}")
            values.append(value)
        results.append(compare(values[:len(a_docs)], values[len(a_docs):], figure, draws, seed))
    return results


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"


def render(results: Sequence[Comparison]) -> str:
    width = max(len(result.figure) for result in results)
    lines = [f"{'figure':<{width}}  {'A median (min-max)':>24}  {'B median (min-max)':>24}"
             f"  {'B/A medians':>11}  {'B/A pair by pair [95%]':>24}  {'B lower':>7}  verdict"]
    for r in results:
        interval = (f"[{r.interval[0]:.2f}, {r.interval[1]:.2f}]"
                    if r.interval is not None else "")
        pair = f"{_number(r.pair_ratio)} {interval}".strip()
        lines.append(
            f"{r.figure:<{width}}"
            f"  {f'{_number(r.a_median)} ({_number(r.a_min)}-{_number(r.a_max)})':>24}"
            f"  {f'{_number(r.b_median)} ({_number(r.b_min)}-{_number(r.b_max)})':>24}"
            f"  {_number(r.medians_ratio):>11}  {pair:>24}"
            f"  {f'{r.b_lower}/{r.pairs}':>7}  {r.verdict}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="connect-coordinator bench compare",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--a", nargs="+", type=Path, required=True, metavar="FILE",
                        help="version A's JSON outputs, in the order they ran")
    parser.add_argument("--b", nargs="+", type=Path, required=True, metavar="FILE",
                        help="version B's, in the same order (B1 ran next to A1, ...)")
    parser.add_argument("--figure", action="append", default=[], metavar="PATH",
                        help="a dotted path to a number, e.g. in_flight.p99_ratio "
                             "(repeatable; default: every number all the files have)")
    parser.add_argument("--draws", type=int, default=DEFAULT_DRAWS,
                        help="bootstrap resamples for the interval (default %(default)s)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED,
                        help="the resampling's seed (default %(default)s)")
    parser.add_argument("--json", action="store_true",
                        help="print a JSON list, one object per figure")
    args = parser.parse_args(argv)
    if args.draws < 100:
        parser.error("--draws must be at least 100")
    try:
        results = compare_files(args.a, args.b, args.figure, args.draws, args.seed)
    except CompareError as error:
        print(f"bench compare: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([asdict(result) for result in results], indent=1))
    else:
        print(render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
