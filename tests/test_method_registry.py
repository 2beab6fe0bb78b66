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

from analysis import microworld
from analysis.microworld import hybrid as microworld_hybrid
from analysis.microworld import runs as microworld_runs
from analysis.scale import pareto_rows
from pbexact import estimators as E
from pbexact.errors import PBInputError
from pbexact.vertices import vertices
from pbscale.execution.group import MemberLosses
from pbscale.methods import (
    COMMANDS,
    MC_METHODS,
    METHODS,
    REGISTRY,
    Capabilities,
    CPSettings,
    LogitsFamily,
    MagnitudeFamily,
    MaskTrainer,
    MCFamily,
    MethodConfig,
    MicroworldHooks,
    Pruning,
    names,
)
from pbscale.methods.registry import MIN_COLOR_DISTANCE, color_distance, register
from pbscale.pruning import config as pconfig
from pbscale.pruning import run as prun
from pbscale.regression import run as rrun
from pbscale.regression.group import MaskTrainerGroup
from pbscale.runs import io

ROOT = Path(__file__).resolve().parents[1]
C = torch.tensor([0.2, 0.7, 0.4, 0.9], dtype=torch.float64)


def quad(z: torch.Tensor) -> torch.Tensor:
    """A differentiable batched loss (..., 4) -> (...)."""
    return ((z - C.to(z.dtype)) ** 2).sum(-1)


def cases(command: str) -> list[str]:
    return [n for n, f in REGISTRY.items() if command in f.caps.commands]


def others(command: str) -> list[str]:
    return [n for n, f in REGISTRY.items() if command not in f.caps.commands]


def n_for(name: str) -> int:
    """An n every method takes (even, >= its minimum)."""
    return max(2, REGISTRY[name].caps.min_samples or 1) * 2


def test_every_family_is_complete():
    for name, f in REGISTRY.items():
        assert f.name == name and f.text and f.label and f.color, name
        assert f.caps.commands and set(f.caps.commands) <= set(COMMANDS), name
        assert not (f.caps.samples and f.caps.deterministic), name
        info = f.info()
        assert set(info) == {"name", "label", "text", "color", "samples", "deterministic",
                             "settings"}
        assert info["name"] == name and info["samples"] == f.caps.samples, name
        assert set(f.Settings.names()) <= set(info["settings"]), name
        # the optional profiles: only the families that need them
        assert ("microworld" in f.caps.commands) == isinstance(f, MicroworldHooks), name
        prunes = bool({"prune-supermask", "prune-joint"} & set(f.caps.commands))
        assert prunes or f.caps.pruning == Pruning(), name


def test_profiles_are_refused_where_a_family_does_not_need_them():
    with pytest.raises(ValueError, match="needs a pruning tool in commands"):
        Capabilities(commands=("regress",), pruning=Pruning(channels=True))

    class NoHooks(LogitsFamily):
        name, label, text, color = "nohooks", "no hooks", "no hooks", "olive"
        caps = Capabilities(commands=("microworld",), uses=("lr", "optimizer"))

    with pytest.raises(ValueError, match="has no microworld hooks; subclass "
                                         "pbscale.methods.MicroworldHooks"):
        register(NoHooks)
    assert "nohooks" not in REGISTRY


def test_no_two_methods_share_a_colour():
    """Colours compared as matplotlib draws them ("C3" is "tab:red"), at least
    MIN_COLOR_DISTANCE apart in CIELAB; also within the microworld's legends, where pbexact's
    estimators meet the torch methods."""
    from matplotlib.colors import to_hex

    drawn = {name: to_hex(f.color) for name, f in REGISTRY.items()}
    assert len(set(drawn.values())) == len(drawn), drawn
    fams = list(REGISTRY.values())
    for i, a in enumerate(fams):
        for b in fams[i + 1:]:
            assert color_distance(a.color, b.color) >= MIN_COLOR_DISTANCE, (a.name, b.name)
    world = {k: to_hex(c) for k, c in microworld.COLORS.items() if c}
    assert len(set(world.values())) == len(world), world


def test_register_refuses_a_colour_drawn_like_another():
    """"crimson" is no string of the registry, but it draws like GMP's "C3" (tab:red): refused,
    naming GMP; a colour matplotlib cannot draw is refused too; a distinct one is taken."""
    assert color_distance("crimson", "C3") < MIN_COLOR_DISTANCE <= color_distance("C3", "C0")

    class Crimson(MagnitudeFamily):
        name, label, text, color = "crimson-test", "X", "X", "crimson"

    with pytest.raises(ValueError, match="draws like gmp's 'C3'"):
        register(Crimson)
    Crimson.color = "not-a-colour"
    with pytest.raises(ValueError, match="no colour matplotlib draws"):
        register(Crimson)
    Crimson.color = "#00ffff"
    try:
        register(Crimson)
        assert "crimson-test" in REGISTRY
    finally:
        REGISTRY.pop("crimson-test", None)


def test_a_prune_only_method_has_a_config_and_regress_refuses_it(tmp_path):
    """MethodConfig takes every registered method (a prune-only family too); the tools refuse
    the methods that do not run in them."""
    for name in others("regress"):
        cfg = MethodConfig(method=name, n=1)
        assert cfg.family is REGISTRY[name] and cfg.to_dict()["method"] == name
    with pytest.raises(PBInputError, match="unknown method"):
        MethodConfig(method="no-such-method")


def test_own_settings_are_hashed_only_when_they_differ_from_their_defaults():
    """A family's own settings leave the hash of a run at their defaults as it was; CP's keep
    the keys they had; a non-default one of another family goes under its name."""
    plain = MethodConfig(method="loorf", n=4)
    assert plain.to_dict() == {"method": "loorf", "n": 4, "param": "sigmoid", "lr": 0.1,
                               "optimizer": "rmsprop", "seed": 0, "chunk": None, "lam": 0.0,
                               "cp_final_tau": 0.005, "cp_every": 100}
    cp = MethodConfig(method="cp", settings={"every": 10})
    assert cp.settings == CPSettings(every=10) and cp.to_dict()["cp_every"] == 10
    assert MethodConfig.from_dict(cp.to_dict()) == cp
    with pytest.raises(PBInputError, match="final_tau"):
        MethodConfig(method="cp", settings={"final_tau": 2.0})
    with pytest.raises(PBInputError, match="has no setting 'tau'"):
        MethodConfig(method="cp", settings={"tau": 0.1})


@pytest.mark.parametrize("root", ["figures/claims/runs", "figures/beyond/runs"])
def test_committed_runs_keep_their_hashed_method_section(root):
    """The hashed method section of every committed run reads back (:meth:`MethodConfig.
    from_dict`) and is written again key for key, so those runs keep their folder names."""
    configs = sorted((ROOT / root).rglob("config.json"))
    assert configs
    for path in configs:
        method = io.read_json(path)["method"]
        if "cut" in method:  # MP/GMP/dense: the schedule of the cuts, no MethodConfig
            continue
        assert MethodConfig.from_dict(method).to_dict() == method, path


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
def test_regress_refuses_the_others(name, tmp_path):
    with pytest.raises(PBInputError, match="unknown method"):
        rrun.train(MethodConfig(method=name, n=1), epochs=1, out=tmp_path)


@pytest.mark.parametrize("name", cases("regress-group"))
def test_batched_step(name):
    configs = [MethodConfig(method=name, n=n_for(name), lr=0.1, seed=s) for s in (0, 1)]
    group = MaskTrainerGroup.flat(configs, 4, total_steps=10)
    r0 = group.r.clone()
    group.zero_grad()
    value, loss = group.surrogate(MemberLosses([quad, quad]))
    assert not value.requires_grad  # each member's step differentiated at once
    group.apply()
    assert np.isfinite(loss) and not torch.equal(group.r, r0)


@pytest.mark.parametrize("name", others("regress-group"))
def test_batched_refuses_the_others(name):
    with pytest.raises(PBInputError, match="do not train as a group"):
        MaskTrainerGroup.check([MethodConfig(method=name, n=n_for(name))])


PRUNE = [(m, n) for m in pconfig.MODES for n in cases(f"prune-{m}")]


@pytest.mark.parametrize("mode,name", PRUNE)
def test_prune_step(tmp_path, mode, name):
    cfg = pconfig.PruneConfig(model="lenet", mode=mode, method=name, synthetic=8, epochs=2,
                            max_batches=1, batch_size=4, val_size=4, n=n_for(name),
                            target=0.5, gmp_every=1, eval_masks=2, eval_batches=1)
    s = prun.run(cfg, tmp_path, quiet=True)
    assert 0 < s["final_remaining"] <= 1 and np.isfinite(s["final_test_loss"])
    family = REGISTRY[name]
    if isinstance(family, MagnitudeFamily) and "target" in family.caps.uses:  # MP, GMP cut to it
        assert s["final_remaining"] * s["masked"] == round(0.5 * s["masked"])
    record = io.read_json(Path(s["folder"]) / "config.json")
    info = record["method_info"]
    assert info["label"] == family.label and info["samples"] == family.caps.samples
    assert set(info["settings"]).isdisjoint(record["info"]["unused"])


@pytest.mark.parametrize("mode,name", [(m, n) for m in pconfig.MODES
                                       for n in others(f"prune-{m}")])
def test_prune_refuses_the_others(mode, name):
    cfg = pconfig.PruneConfig(model="lenet", mode=mode, method=name, synthetic=8)
    with pytest.raises(PBInputError, match="unknown method|does not run in --mode"):
        cfg.resolved().validate()


@pytest.mark.parametrize("name", cases("microworld"))
def test_microworld_step(name):
    J = ((vertices(4) - C.numpy()) ** 2).sum(-1)
    t = microworld_hybrid.run_torch(quad, J, name, n=2, lr=0.1, steps=3, seeds=2, seed=0)
    assert t.final_theta.shape[-1] == 4 and np.isfinite(t.mean).all()
    assert len(t.final) == (1 if REGISTRY[name].caps.deterministic else 2)


@pytest.mark.parametrize("name", others("microworld"))
def test_microworld_torch_runs_refuse_the_others(name):
    with pytest.raises(PBInputError, match="unknown method"):
        microworld_hybrid.check_torch_method(name, 2)


def test_every_list_of_methods_is_a_registry_query():
    mc = tuple(n for n, s in E.REGISTRY.items() if not s.needs_table)
    assert MC_METHODS == mc == names(samples=True)
    assert all(isinstance(REGISTRY[n], MCFamily) for n in mc)
    assert METHODS == names("regress")
    assert set(pconfig.PRUNE_METHODS) == set(names("prune-supermask") + names("prune-joint"))
    assert microworld_hybrid.TORCH_METHODS == names("microworld")
    assert set(microworld_runs.DETERMINISTIC) == {
        microworld_runs.TRUE, *names("microworld", deterministic=True)}
    assert pareto_rows.MC == mc
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
CHECKED = [p for pkg in ("pbscale", "analysis", "benchmarks")
           for p in sorted((ROOT / pkg).rglob("*.py"))]
#: Known branches on a method's name, as (file, line text): none is left.
ALLOWED: set[tuple[str, str]] = set()


def name_branches(paths: list[Path], root: Path = ROOT) -> list[tuple[str, int, str]]:
    """(file, line number, line) of every comparison with a method's name, ``x == "cp"``,
    ``x != "cp"``, and of every membership test in a condition (if / elif / and / or / not
    ... in (...)) over a tuple holding one."""
    words = "|".join(re.escape(n) for n in (*REGISTRY, *E.REGISTRY))
    compare = re.compile(rf"""(==|!=)\s*["']({words})["']""")
    member = re.compile(rf"""\b(if|elif|and|or|not)\b.*\bin\s*\([^)]*["']({words})["']""")
    return [(p.relative_to(root).as_posix(), i, line.strip()) for p in paths
            for i, line in enumerate(p.read_text().splitlines(), 1)
            if compare.search(line) or member.search(line)]


def test_no_module_branches_on_a_method_name():
    found = [f"{p}:{i}: {line}" for p, i, line in name_branches(CHECKED)
             if (p, line) not in ALLOWED]
    assert found == []
    assert {"analysis", "benchmarks", "pbscale"} <= {p.relative_to(ROOT).parts[0]
                                                     for p in CHECKED}


def test_the_name_guard_finds_an_injected_branch(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('if method == "cp":\n    pass\nif m in ("arms", "loorf"):\n    pass\n'
                   'ok = name == other\n')
    assert [i for _, i, _ in name_branches([bad], tmp_path)] == [1, 3]
