"""Do two runs log the same metrics? For refactors: a seeded run before and after must agree.

    python bench/same_metrics.py RUN_A RUN_B [--rel 0]

Compares ``metrics.jsonl`` record by record, every key except wall-clock ones (``time/*``, ``perf/*``).
Prints IDENTICAL, or the differing keys (values within ``--rel`` relative tolerance are listed as tiny);
exits 1 when a difference beyond the tolerance is found.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import click

CLOCK = ("time/", "perf/", "async/overlap_s")


def records(run: Path) -> list:
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(CLOCK)}
            for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def differences(a: list, b: list, rel: float) -> tuple[list, list]:
    """(differences beyond ``rel``, differences within it) as (record, key, value a, value b)."""
    big, tiny = [], []
    if len(a) != len(b):
        big.append((None, "records", len(a), len(b)))
    for i, (x, y) in enumerate(zip(a, b)):
        for k in sorted(set(x) | set(y)):
            vx, vy = x.get(k), y.get(k)
            if vx == vy:
                continue
            close = isinstance(vx, (int, float)) and isinstance(vy, (int, float)) and \
                math.isclose(vx, vy, rel_tol=rel, abs_tol=0.0)
            (tiny if close and rel > 0 else big).append((i, k, vx, vy))
    return big, tiny


@click.command()
@click.argument("run_a", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("run_b", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--rel", default=0.0, show_default=True, help="relative tolerance for numbers")
def main(run_a: Path, run_b: Path, rel: float):
    big, tiny = differences(records(run_a), records(run_b), rel)
    if not big and not tiny:
        click.echo(f"IDENTICAL ({len(records(run_a))} records)")
    for label, rows in (("differs", big), ("tiny", tiny)):
        for i, k, vx, vy in rows:
            click.echo(f"{label}: record {i} {k}: {vx!r} vs {vy!r}")
    sys.exit(1 if big else 0)


if __name__ == "__main__":
    main()
