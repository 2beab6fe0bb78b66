"""The method registry (:mod:`pbscale.methods.registry`): every registered method runs one step
in each command it claims and is refused by the others; every list of methods is a query of the
registry; an MC estimator added to pbexact's registry is a method at once; no module branches
on a method's name."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from analysis import microworld, microworld_hybrid, microworld_runs, pareto
from pbexact import estimators as E
from pbexact.errors import PBInputError
from pbexact.vertices import vertices
from pbscale import prune
from pbscale.methods import (
    COMMANDS,
    MC_METHODS,
    METHODS,
    REGISTRY,
    MaskTrainer,
    MaskTrainerGroup,
    MCFamily,
    MethodConfig,
    names,
)

ROOT = Path(__file__).resolve().parents[1]
C = torch.tensor([0.2, 0.7, 0.4, 0.9], dtype=torch.float64)


def quad(z: torch.Tensor) -> torch.Tensor:
    """A differentiable batched loss (..., 4) -> (...)."""
    return ((z - C.to(z.dtype)) ** 2).sum(-1)


def cases(command: str) -> list[str]:
    return [n for n, f in REGISTRY.items() if command in f.commands]


def others(command: str) -> list[str]:
    return [n for n, f in REGISTRY.items() if command not in f.commands]


def n_for(name: str) -> int:
    """An n every method takes (even, >= its minimum)."""
    return max(2, REGISTRY[name].min_samples or 1) * 2


def test_every_family_is_complete():
    for name, f in REGISTRY.items():
        assert f.name == name and f.text and f.label and f.color, name
        assert f.commands and set(f.commands) <= set(COMMANDS), name
        assert not (f.samples and f.deterministic), name


@pytest.mark.parametrize("name", cases("regress"))
def test_regress_step(name):
    cfg = MethodConfig(method=name, n=n_for(name), lr=0.1, seed=3)
    trainer = MaskTrainer(cfg, 4, total_steps=10)
    r0 = trainer.r.detach().clone()
    loss = trainer.step(quad)
    assert np.isfinite(loss)
    assert not torch.equal(trainer.r.detach(), r0)
    masks = trainer.sample_masks(3)
    assert masks.shape == (3, 4) and set(masks.unique().tolist()) <= {0.0, 1.0}
    theta = trainer.theta()
    assert theta.shape == (4,) and bool(((theta >= 0) & (theta <= 1)).all())


@pytest.mark.parametrize("name", others("regress"))
def test_regress_refuses_the_others(name):
    with pytest.raises(PBInputError, match="unknown method"):
        MethodConfig(method=name).validate()


@pytest.mark.parametrize("name", cases("batched"))
def test_batched_step(name):
    configs = [MethodConfig(method=name, n=n_for(name), lr=0.1, seed=s) for s in (0, 1)]
    group = MaskTrainerGroup(configs, 4, total_steps=10)
    r0 = group.r.clone()
    group.zero_grad()
    value, loss = group.surrogate(lambda z: quad(z))
    value.backward()
    group.apply()
    assert np.isfinite(loss) and not torch.equal(group.r, r0)


@pytest.mark.parametrize("name", [n for n in others("batched") if n in METHODS])
def test_batched_refuses_the_others(name):
    with pytest.raises(PBInputError, match="batched runs are MC runs"):
        MaskTrainerGroup.check([MethodConfig(method=name, n=n_for(name))])


PRUNE = [(m, n) for m in prune.MODES for n in cases(f"prune-{m}")]


@pytest.mark.parametrize("mode,name", PRUNE)
def test_prune_step(tmp_path, mode, name):
    cfg = prune.PruneConfig(model="lenet", mode=mode, method=name, synthetic=8, epochs=2,
                            max_batches=1, batch_size=4, val_size=4, n=n_for(name),
                            target=0.5, gmp_every=1, eval_masks=2, eval_batches=1)
    s = prune.run(cfg, tmp_path, quiet=True)
    assert 0 < s["final_remaining"] <= 1 and np.isfinite(s["final_test_loss"])
    if REGISTRY[name].cuts:
        assert s["final_remaining"] * s["masked"] == round(0.5 * s["masked"])


@pytest.mark.parametrize("mode,name", [(m, n) for m in prune.MODES
                                       for n in others(f"prune-{m}")])
def test_prune_refuses_the_others(mode, name):
    cfg = prune.PruneConfig(model="lenet", mode=mode, method=name, synthetic=8)
    with pytest.raises(PBInputError, match="unknown method|does not run in --mode"):
        cfg.resolved().validate()


@pytest.mark.parametrize("name", cases("microworld"))
def test_microworld_step(name):
    J = ((vertices(4) - C.numpy()) ** 2).sum(-1)
    t = microworld_hybrid.run_torch(quad, J, name, n=2, lr=0.1, steps=3, seeds=2, seed=0)
    assert t.final_theta.shape[-1] == 4 and np.isfinite(t.mean).all()
    assert len(t.final) == (1 if REGISTRY[name].deterministic else 2)


@pytest.mark.parametrize("name", others("microworld"))
def test_microworld_torch_runs_refuse_the_others(name):
    with pytest.raises(PBInputError, match="unknown method"):
        microworld_hybrid.check_torch_method(name, 2)


def test_every_list_of_methods_is_a_registry_query():
    mc = tuple(n for n, s in E.REGISTRY.items() if not s.needs_table)
    assert MC_METHODS == mc == names(samples=True)
    assert all(isinstance(REGISTRY[n], MCFamily) for n in mc)
    assert METHODS == names("regress")
    assert set(prune.PRUNE_METHODS) == set(names("prune-supermask") + names("prune-joint"))
    assert microworld_hybrid.TORCH_METHODS == names("microworld")
    assert set(microworld_runs.DETERMINISTIC) == {
        microworld_runs.TRUE, *names("microworld", deterministic=True)}
    assert pareto.MC == mc
    # every gradient source of the microworld has a legend and a colour
    for name in (*microworld_runs.EXACT_METHODS, *microworld_hybrid.TORCH_METHODS):
        assert name in microworld.LABELS and name in microworld.COLORS


def test_a_new_estimator_with_an_existing_law_is_a_method(monkeypatch):
    """One EstimatorSpec in pbexact's registry makes a method of every MC command: here LOORF
    under another name must give LOORF's step, bit for bit."""
    spec = dataclasses.replace(E.REGISTRY["loorf"], name="loorf_copy", color="")
    monkeypatch.setitem(E.REGISTRY, spec.name, spec)
    monkeypatch.setitem(REGISTRY, spec.name, MCFamily(spec))
    steps = {}
    for name in ("loorf", "loorf_copy"):
        trainer = MaskTrainer(MethodConfig(method=name, n=4, seed=5), 4, total_steps=10)
        trainer.step(quad)
        steps[name] = trainer.r.detach()
    assert torch.equal(steps["loorf"], steps["loorf_copy"])


#: Modules that must not branch on a method's name (the registries define the names).
CHECKED = [*sorted((ROOT / "pbscale").rglob("*.py")),
           *(ROOT / "analysis" / f for f in ("microworld.py", "microworld_hybrid.py",
                                            "microworld_runs.py", "pareto.py", "report.py"))]


def test_no_module_branches_on_a_method_name():
    words = "|".join(re.escape(n) for n in (*REGISTRY, *E.REGISTRY))
    # x == "cp", x != "cp", and membership tests in conditions: if / elif / and / or ... in (...)
    compare = re.compile(rf"""(==|!=)\s*["']({words})["']""")
    member = re.compile(rf"""\b(if|elif|and|or|not)\b.*\bin\s*\([^)]*["']({words})["']""")
    found = [f"{p.relative_to(ROOT)}:{i}" for p in CHECKED
             for i, line in enumerate(p.read_text().splitlines(), 1)
             if compare.search(line) or member.search(line)]
    assert found == []
    assert compare.search('if method == "cp":') and member.search('if m in ("arms", "loorf"):')
