"""Settings reachable everywhere (issue 39): every field of every family's own ``Settings`` is
an option of each tool the family runs in, shown in ``--help`` with its default, and a sweep
key; the help texts that name methods are queries of the registry; a run, pareto's runs.csv and
a sweep's results list only the settings its method reads, ``lam`` and ``chunk`` included."""

from __future__ import annotations

import csv
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from analysis import pareto
from pbscale import prune, regress, sweep
from pbscale.methods import REGISTRY, Capabilities, MaskFamily, Settings, setting
from pbscale.methods.options import option, options
from pbscale.pruning import config as pconfig
from pbscale.pruning.config import PRUNE_COMMANDS, PruneConfig, method_reads
from pbscale.runs import io
from pbscale.sweep.file import load

ROOT = Path(__file__).resolve().parents[1]
#: Each tool that takes the methods' own settings, with the registry's commands it serves.
TOOLS = {"pbscale.prune": (prune, PRUNE_COMMANDS), "pbscale.regress": (regress, ("regress",))}


@dataclass(frozen=True)
class SlowStartSettings(Settings):
    warmup: float = setting(0.25, "fraction of training before the first cut")


class SlowStart(MaskFamily):
    """A family registered by the tests below only: a setting of its own and a cut to
    --target, as a newcomer's family would have."""

    name, label, text, color = "slowstart", "Slow start", "slow-start", "olivedrab"
    caps = Capabilities(commands=PRUNE_COMMANDS, uses=("target",))
    Settings = SlowStartSettings


@pytest.fixture
def newcomer(monkeypatch):
    monkeypatch.setitem(REGISTRY, SlowStart.name, SlowStart())
    return REGISTRY[SlowStart.name]


def help_text(module) -> str:
    parser = module.build_parser()
    return " ".join(parser.format_help().split())


@pytest.mark.parametrize("tool", list(TOOLS))
def test_every_setting_is_an_option_with_its_default(tool, newcomer):
    module, commands = TOOLS[tool]
    parser = module.build_parser()
    dests = {a.dest: a for a in parser._actions}
    text = help_text(module)
    fams = [f for f in REGISTRY.values() if set(f.caps.commands) & set(commands)]
    assert any(dataclasses.fields(f.Settings) for f in fams), tool  # not vacuous
    for family in fams:
        for field in dataclasses.fields(family.Settings):
            opt = option(family, field)
            assert opt.dest in dests, (tool, opt.flag)
            action = dests[opt.dest]
            assert action.default == field.default and action.id_when_changed
            assert f"{opt.flag} " in text and f"(default: {field.default:g})" in text
    assert ("--slowstart-warmup" in text) == (tool == "pbscale.prune")


def test_help_texts_name_the_methods_from_the_registry(newcomer):
    """Each shared setting's help in prune names every method that reads it, a family
    registered now included (--target's help once missed a new family)."""
    parser = prune.build_parser()
    helps = {a.dest: " ".join((a.help or "").split()) for a in parser._actions}
    for dest, shared in (("target", "target"), ("lam", "lam"), ("mask_lr", "lr"),
                         ("chunk", "chunk"), ("prune_at", "prune_at"),
                         ("gmp_every", "gmp_every")):
        readers = [f.text for f in REGISTRY.values()
                   if shared in f.caps.uses and set(f.caps.commands) & set(PRUNE_COMMANDS)]
        assert readers, dest
        for text in readers:
            assert text in helps[dest], (dest, text)
    assert "slow-start" in helps["target"]
    assert "slow-start" in " ".join(parser.description.split())


def test_a_setting_is_a_sweep_key_in_the_run_id_only_when_set(tmp_path, newcomer):
    """``slowstart_warmup`` is a key of a prune sweep, checked by its option's type; a run
    that leaves it at its default keeps the id it had before the setting existed."""
    path = tmp_path / "s.toml"
    path.write_text('[sweep]\ncommand = "prune"\nout = "o"\n[base]\nmethod = "slowstart"\n'
                    '[[grid]]\nslowstart_warmup = [0.25, 0.5]\n')
    runs = load(path).runs
    assert [r.full.get("slowstart_warmup") for r in runs] == [None, 0.5]
    path.write_text('[sweep]\ncommand = "prune"\nout = "o"\n[base]\nmethod = "slowstart"\n')
    assert load(path).runs[0].id == runs[0].id
    path.write_text('[sweep]\ncommand = "prune"\nout = "o"\n[base]\nslowstart_warmup = "x"\n')
    with pytest.raises(ValueError, match="--slowstart-warmup x: expected a number"):
        load(path)


def test_a_setting_is_hashed_only_off_its_default(newcomer):
    plain = PruneConfig(method="slowstart").resolved().validate()
    same = PruneConfig(method="slowstart", settings={"warmup": 0.25}).resolved().validate()
    other = PruneConfig(method="slowstart", settings={"warmup": 0.5}).resolved().validate()
    assert plain.hashed() == same.hashed() and "slowstart_warmup" not in plain.hashed()
    assert other.hashed()["slowstart_warmup"] == 0.5 and "settings" not in other.hashed()
    assert other.legacy_hashed()["settings"] == {"warmup": 0.5}  # format 1 nested them
    with pytest.raises(ValueError, match="slow-start has no setting 'cooldown'"):
        PruneConfig(method="slowstart", settings={"cooldown": 1}).resolved().validate()


def test_what_a_run_reads_follows_its_capabilities():
    """lam and chunk are read exactly where ``caps.uses`` names them (edge-popup has no L0
    term; CP evaluates no samples in chunks); what a run does not read is unused."""
    for name in pconfig.PRUNE_METHODS:
        family = REGISTRY[name]
        reads = method_reads(family)
        assert ("lam" in reads) == ("lam" in family.caps.uses), name
        assert ("chunk" in reads) == ("chunk" in family.caps.uses), name
        unused = PruneConfig(method=name, mode=next(
            m for m in pconfig.MODES if f"prune-{m}" in family.caps.commands)).unused()
        assert not set(reads) & set(unused), name
    assert "lam" not in method_reads(REGISTRY["edgepopup"])
    assert "chunk" not in method_reads(REGISTRY["cp"]) and "n" not in method_reads(REGISTRY["cp"])


def test_runs_csv_and_sweep_results_list_what_each_method_reads(tmp_path, monkeypatch):
    """A sweep of CP, LOORF and edge-popup sharing lam, n and chunk: config.json lists each
    run's unused settings, the sweep's results leave them empty, pareto's runs.csv leaves the
    lam of edge-popup empty."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    path = tmp_path / "s.toml"
    path.write_text('[sweep]\ncommand = "prune"\nout = "out"\n[base]\nsynthetic = 24\n'
                    'epochs = 1\nmax_batches = 1\nbatch_size = 8\nval_size = 8\nn = 4\n'
                    'chunk = 2\nlam = 0.001\ntarget = 0.5\neval_masks = 2\neval_batches = 1\n'
                    '[[grid]]\nmethod = ["cp", "loorf", "edgepopup"]\n')
    assert sweep.main(["run", str(path), "--jobs", "1"]) == 0
    assert sweep.main(["results", str(path), "--csv", str(tmp_path / "r.csv")]) == 0
    with open(tmp_path / "r.csv") as fh:
        rows = {r["method"]: r for r in csv.DictReader(fh)}
    assert (rows["loorf"]["n"], rows["loorf"]["chunk"], rows["loorf"]["lam"]) == (
        "4", "2", "0.001")
    assert (rows["cp"]["n"], rows["cp"]["chunk"], rows["cp"]["lam"]) == ("", "", "0.001")
    assert (rows["edgepopup"]["lam"], rows["edgepopup"]["target"]) == ("", "0.5")
    assert rows["cp"]["target"] == ""
    for r in rows.values():
        record = json.loads((Path(r["folder"]) / "config.json").read_text())
        assert set(record["method_info"]["settings"]).isdisjoint(record["info"]["unused"])
    assert pareto.main([str(tmp_path / "out"), "--out", str(tmp_path / "plots")]) == 0
    with open(tmp_path / "plots" / "runs.csv") as fh:
        plotted = {r["label"].partition("-")[0]: r for r in csv.DictReader(fh)}
    assert plotted["edgepopup"]["lam"] == "" and plotted["cp"]["lam"] == "0.001"


def test_regress_records_and_warns_what_it_does_not_read(tmp_path, capsys):
    """CP in pbscale.regress reads neither n nor chunk (warned, recorded as unused) but its own
    settings; LOORF does not read CP's (warned)."""
    common = ["--epochs", "1", "--quiet", "--out", str(tmp_path), "--threads", "1"]
    assert regress.main(["--method", "cp", "--n", "3", "--chunk", "2", "--cp-every", "5",
                         *common]) == 0
    assert "warning: CP does not use --chunk, --n: ignored" in capsys.readouterr().err
    (cfg,) = tmp_path.glob("cp-*/config.json")
    record = io.read_json(cfg)
    assert {"n", "param", "chunk"} <= set(record["info"]["unused"])
    assert record["method"]["cp_every"] == 5
    assert [o.dest for o in options(("regress",)) if o.method == "cp"] == ["cp_final_tau",
                                                                         "cp_every"]
    assert regress.main(["--method", "loorf", "--n", "2", "--cp-every", "5", *common]) == 0
    assert "warning: LOORF does not use --cp-every: ignored" in capsys.readouterr().err


def test_a_family_without_lam_gets_no_l0_term():
    """A logits family whose capabilities do not name lam (edge-popup: a fixed count) takes
    no L0 term whatever the run's lam: its step is the step at lam = 0 (it gives no theta map
    for one); a family that names lam does get it."""
    import torch

    from pbscale.methods import MaskTrainer, MethodConfig

    def f(z):
        return ((z - 0.3) ** 2).sum(-1)

    for method, uses_lam in (("edgepopup", False), ("cp", True)):
        assert ("lam" in REGISTRY[method].caps.uses) == uses_lam
        grads = [MaskTrainer(MethodConfig(method=method, n=1, seed=2, lam=lam), 6, 10,
                             dtype=torch.float64).gradient(f).grad for lam in (0.0, 0.5)]
        assert torch.equal(grads[0], grads[1]) != uses_lam, method
