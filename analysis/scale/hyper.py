"""Do the best settings at a small n carry over to a larger n? (`sec:app_supermask_hypers`,
`fig:app_hyper_gen_scatter`, `fig:app_hyper_gen_parallel`.)

The paper reused the best settings found at n = 10 for n = 100 and checked the choice afterwards
on its supermask runs: "on the majority of cases, runs became sparser or retained similar
sparsity, but achieved higher accuracy", the exceptions being failed runs at chance. Here, for
each MC method and parametrization with runs at two or more n of one setting (every option but
the seed and n, and the same training budget), :func:`generalization_rows` gives each (setting, n)
its seed means and whether it is on its n's Pareto front, and :func:`carry_over` reads the
paper's observation off them: per pair of n, how many settings became sparser or kept their
sparsity (within :data:`SIMILAR` in log) while gaining accuracy, how many runs failed (chance
accuracy), and the rank correlation of the settings' accuracies at the two n.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

import numpy as np
from scipy import stats

from analysis.scale.fronts import pareto_front
from analysis.scale.runs import STALLED_ACC, RunRecord, finished

#: Two remaining fractions within this factor are "similar sparsity".
SIMILAR = 1.1
#: The columns of hyper_generalization.csv.
COLUMNS = ("method", "param", "setting", "lam", "mask_lr", "n", "seeds", "remaining", "test_acc",
           "failed", "on_front")


def setting_key(r: RunRecord) -> str:
    """A run's setting without its seed and n (the hyperparameters the paper reuses across n)."""
    return json.dumps({k: v for k, v in r.settings.items() if k != "n"}, sort_keys=True,
                      default=str)


def setting_words(r: RunRecord) -> str:
    """``lam 0.001, lr 0.01, rmsprop`` (the hyperparameters that vary in a sweep)."""
    return (f"lam {r.get('lam'):g}, lr {r.get('mask_lr'):g}, {r.get('mask_opt')}, "
            f"{r.get('epochs')} ep")


def generalization_rows(records: Sequence[RunRecord]) -> list[dict]:
    """Supermask MC runs with one setting at two or more n: a row per (setting, n) with its seed
    means, whether it failed (mean accuracy at chance) and whether it is on the front of its
    method, parametrization and n."""
    mc = [r for r in finished(records) if r.experiment == "supermask" and r.info.samples
          and r.get("n") is not None]
    by: dict[tuple, list[RunRecord]] = {}
    for r in mc:
        by.setdefault((r.method, r.get("param"), setting_key(r), int(r.get("n"))), []).append(r)
    ns_of: dict[tuple, set[int]] = {}
    for m, p, key, n in by:
        ns_of.setdefault((m, p, key), set()).add(n)
    rows = []
    for (m, p, key, n), rs in sorted(by.items()):
        if len(ns_of[m, p, key]) < 2:
            continue
        rows.append({"method": m, "param": p, "setting": setting_words(rs[0]),
                     "lam": float(rs[0].get("lam")), "mask_lr": float(rs[0].get("mask_lr")), "n": n,
                     "seeds": len(rs), "remaining": float(np.mean([r.remaining for r in rs])),
                     "test_acc": float(np.mean([r.accuracy for r in rs])), "key": key})
    for row in rows:
        row["failed"] = int(row["test_acc"] < STALLED_ACC)
    for group in {(r["method"], r["param"], r["n"]) for r in rows}:
        mine = [r for r in rows if (r["method"], r["param"], r["n"]) == group]
        pts = [{"remaining": r["remaining"], "test_acc": r["test_acc"], "row": r} for r in mine]
        front = {id(p["row"]) for p in pareto_front(pts)}
        for r in mine:
            r["on_front"] = int(id(r) in front)
    return rows


def carry_over(rows: Sequence[dict]) -> list[dict]:
    """Per method, parametrization and pair of n (small, large): the settings run at both, how
    many became sparser or kept a similar sparsity and gained accuracy (failed runs apart), how
    many failed at the large n, whether the small n's front settings are on the large n's
    front, and Spearman's rank correlation of the settings' accuracies (NaN below three)."""
    out = []
    for m, p in sorted({(r["method"], r["param"]) for r in rows}):
        mine = [r for r in rows if (r["method"], r["param"]) == (m, p)]
        ns = sorted({r["n"] for r in mine})
        for i, small in enumerate(ns):
            for large in ns[i + 1:]:
                a = {r["key"]: r for r in mine if r["n"] == small}
                b = {r["key"]: r for r in mine if r["n"] == large}
                both = sorted(set(a) & set(b))
                if not both:
                    continue
                ok = [k for k in both if not a[k]["failed"] and not b[k]["failed"]]
                better = sum(b[k]["remaining"] <= SIMILAR * a[k]["remaining"]
                             and b[k]["test_acc"] > a[k]["test_acc"] for k in ok)
                kept = [k for k in both if a[k]["on_front"]]
                rho = (float(stats.spearmanr([a[k]["test_acc"] for k in both],
                                             [b[k]["test_acc"] for k in both]).statistic)
                       if len(both) >= 3 else math.nan)
                out.append({"method": m, "param": p, "n_small": small, "n_large": large,
                            "settings": len(both), "failed_large": sum(b[k]["failed"]
                                                                       for k in both),
                            "sparser_and_better": better, "not_failed": len(ok),
                            "front_settings": len(kept),
                            "front_settings_on_front": sum(b[k]["on_front"] for k in kept),
                            "rank_correlation": rho})
    return out


def carry_over_text(c: dict) -> str:
    """One line of :func:`carry_over`'s reading."""
    rho = ("" if math.isnan(c["rank_correlation"]) else
           f"; rank correlation of accuracy {c['rank_correlation']:+.2f}")
    return (f"{c['method']} {c['param']} n={c['n_small']} -> n={c['n_large']}: "
            f"{c['settings']} setting{'s' * (c['settings'] != 1)} at both; "
            f"{c['sparser_and_better']} of {c['not_failed']} "
            f"not failed became sparser or kept their sparsity and gained accuracy; "
            f"{c['failed_large']} failed at n={c['n_large']}; {c['front_settings_on_front']} of "
            f"{c['front_settings']} front settings at n={c['n_small']} stay on the front{rho}")
