"""The emulated GPU host-synchronization check (`benchmarks/check_gpu_sync.py`): a
step's CUDA code path, run on meta tensors, makes no host synchronization but the known loss
read-back, and the check does catch each kind of sync when one is injected."""

from __future__ import annotations

import warnings

import pytest
import torch

from benchmarks import check_gpu_sync as cgs
from pbexact import parametrizations as P
from pbscale import methods as M

META = cgs.EMULATED
HERE = "tests/test_gpu_sync_check.py"


def test_emulated_step_pieces_have_only_the_known_readback(capsys: pytest.CaptureFixture):
    assert cgs.main(["--emulate", "--n", "10", "--chunk", "5", "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "SYNC" not in out
    # "name  verdict": names have single spaces, the column pads with two or more
    lines = {name: rest for name, _, rest in (line.partition("  ") for line in out.splitlines())}
    for name in ("copula sampler (ARMS)", "Bernoulli sampler (LOORF)",
                 "antithetic sampler (DisARM)", "batched loss f(z)"):
        assert lines[name].strip() == "no sync"
    for est in ("ARMS", "LOORF", "DISARM", "REINFORCE"):
        for param in ("sigmoid", "escort"):
            # exactly one read-back per step (2 steps), in mc_gradient
            assert "known read-back (2x: pbscale/methods/mc.py:" in lines[f"{est} step ({param})"]
            assert "in mc_gradient" in lines[f"{est} step ({param})"]
    assert "in mc_gradient" in lines["MaskTrainerGroup ARMS step (2 runs)"]
    assert "(2x:" in lines["ARMS step, joint weights (loop)"]
    assert "(2x:" in lines["CP step"] and "in sample_mean" in lines["CP step"]


def test_emulation_takes_the_cuda_branches():
    gen = torch.Generator().manual_seed(0)
    theta = torch.full((6,), 0.3, device=META)
    assert not M.CopulaSampler(theta, 4, gen)._ints  # stick-breaking, as on CUDA
    assert M.BernoulliSampler(theta, gen)._scaled is None  # torch.rand, as on CUDA
    # the CPU twins do take the host-only branches (so the routing is real)
    assert M.CopulaSampler(torch.full((6,), 0.3), 4, gen)._ints
    assert M.BernoulliSampler(torch.full((6,), 0.3), gen)._scaled is not None
    with cgs.host_generators():
        tr = M.MaskTrainer(M.MethodConfig(method="arms", n=4, chunk=2), 6, 10, META)
    assert tr.r.device.type == "meta" and tr.generator.device.type == "cpu"
    assert torch.Generator(device="cpu").device.type == "cpu"


x = torch.ones(4, device=META)
INJECTED = {
    "item": lambda: x.sum().item(),
    "float": lambda: float(x.sum()),
    "bool": lambda: bool((x > 0).all()),
    "boolean mask": lambda: x[x > 0],
    "masked assignment": lambda: x.clone().__setitem__(x > 0, 0.0),
    "nonzero": lambda: torch.nonzero(x),
    "to host": lambda: x.cpu(),
    "tolist": lambda: x.tolist(),
    "torch.tensor to device": lambda: torch.tensor([1.0, 2.0], device=META),
    "blocking copy from host": lambda: torch.ones(3).to(META),
    "equal": lambda: torch.equal(x, x),
}


@pytest.mark.parametrize("kind", sorted(INJECTED))
def test_each_injected_sync_is_caught_with_its_line(kind: str):
    v = cgs.emulated_check(INJECTED[kind])
    assert not v.clean and v.problem.startswith(f"SYNC at {HERE}:")
    assert len(v.syncs) == 1


def test_other_data_needs_are_reported():
    v = cgs.emulated_check(lambda: x.numpy())
    assert not v.clean and v.problem.startswith(f"SYNC? needs the data at {HERE}:")


def test_no_false_alarm_on_async_work():
    def fine() -> None:
        y = torch.randn(5, 3, device=META, generator=torch.Generator().manual_seed(1))
        z = torch.where(y > 0, y, 0.0).cumprod(0) @ torch.ones(3, device=META)
        z.sort()
        torch.ones(3).to(META, non_blocking=True)
        x + torch.tensor(2.0)  # a 0-dim host tensor is passed to the kernel as a scalar
        x[torch.arange(2, device=META)]  # integer indices: no nonzero
    assert cgs.emulated_check(fine).describe() == "no sync"


def test_sync_in_backward_is_caught():
    a = torch.ones(5, device=META, requires_grad=True)

    class Twice(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t: torch.Tensor) -> torch.Tensor:
            return t * 2

        @staticmethod
        def backward(ctx, g: torch.Tensor) -> torch.Tensor:
            if bool(g.sum() > 0):  # injected
                return g * 2
            return g

    v = cgs.emulated_check(lambda: Twice.apply(a).sum().backward())
    assert not v.clean and "in backward" in v.problem


def _arms_step(n: int = 6, chunk: int = 3, steps: int = 2, param: str = "sigmoid") -> cgs.Piece:
    pieces = cgs.make_pieces(META, n, chunk, steps, ("arms",), (param,), group=2)
    return next(p for p in pieces if p.name == f"ARMS step ({param})")


def test_whole_step_fails_on_a_sync_injected_into_the_sampler(monkeypatch: pytest.MonkeyPatch):
    p = _arms_step()
    assert cgs.emulated_check(p.run, p.allowed, 2).clean
    draw = M.CopulaSampler.next

    def syncing_next(self, k: int) -> torch.Tensor:
        z = draw(self, k)
        if not bool(z.any()):  # injected sync
            pass
        return z

    monkeypatch.setattr(M.CopulaSampler, "next", syncing_next)
    v = cgs.emulated_check(p.run, p.allowed, 2)
    assert not v.clean and "in syncing_next" in v.problem and HERE in v.problem


def test_whole_step_fails_on_the_old_sigmoid_shortcut(monkeypatch: pytest.MonkeyPatch):
    """The sync found on an H200 (the sigmoid score's all-inside shortcut tested on the device)
    is caught again if the host-only guard is dropped."""
    def unguarded_score(self, z, r):
        t = self.theta(r)
        inside = P._interior(t)
        if bool(inside.all()):
            return z - t
        return P.arrays.namespace(t).where(inside, z - t, 0.0)

    p = _arms_step()
    monkeypatch.setattr(P.Sigmoid, "score", unguarded_score)
    v = cgs.emulated_check(p.run, p.allowed, 2)
    assert not v.clean and "in unguarded_score" in v.problem


def test_a_second_readback_per_step_fails():
    def readback() -> float:
        return float(x.sum())

    site = {(HERE, "readback"): 1}
    twice = cgs.emulated_check(lambda: [readback() for _ in range(4)], site, steps=2)
    once = cgs.emulated_check(lambda: [readback() for _ in range(2)], site, steps=2)
    assert once.clean and "known read-back (2x" in once.describe()
    assert not twice.clean and "4 read-backs in 2 steps" in twice.problem
    # elsewhere the same call is not allowed
    assert not cgs.emulated_check(lambda: float(x.sum()), site, steps=2).clean


def test_patches_are_undone():
    tensor, as_tensor, generator = torch.tensor, torch.as_tensor, torch.Generator
    cgs.emulated_check(lambda: torch.tensor(1.0, device=META))
    with cgs.host_generators():
        pass
    assert (torch.tensor, torch.as_tensor, torch.Generator) == (tensor, as_tensor, generator)


def test_bad_arguments_exit_2(capsys: pytest.CaptureFixture):
    assert cgs.main(["--emulate", "--n", "1"]) == 2
    assert "--n >= 2" in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_check_reports_an_item():
    y = torch.ones(3, device="cuda")
    v = cgs.gpu_check(lambda: y.sum().item())
    assert not v.clean and HERE in v.problem


@pytest.mark.parametrize("lead", [(), (2,)])
def test_mc_surrogate_makes_no_second_sync(lead: tuple[int, ...]):
    """mc_surrogate used to turn the read-back loss into a device tensor (torch.tensor(loss,
    device=...)): a second, blocking copy per step. Its value is unchanged by passing the float:
    float32(loss) exactly, as the tensor made from it was."""
    from pbexact.parametrizations import get_parametrization

    sigmoid = get_parametrization("sigmoid")

    def setup(device: torch.device | str):
        w = torch.linspace(-1, 1, 6, device=device)
        gens = ([torch.Generator().manual_seed(s) for s in range(2)] if lead
                else torch.Generator().manual_seed(0))
        r = torch.full((*lead, 6), 0.2, device=device, requires_grad=True)
        return (lambda z: (z * w).sum(-1)), r, gens

    f, r, gens = setup(META)

    def run() -> None:
        L, _ = M.mc_surrogate(f, r, sigmoid, "arms", 4, gens, 2)
        L.backward()

    assert cgs.emulated_check(run, {cgs.LOSS_READBACK: 1}, 1).clean
    f, r, gens = setup("cpu")
    L, est = M.mc_surrogate(f, r, sigmoid, "arms", 4, gens, 2)
    loss = est.loss if isinstance(est.loss, float) else float(est.loss.sum())
    assert L.dtype == r.dtype and L.item() == torch.tensor(loss, dtype=r.dtype).item()
    L.backward()
    assert torch.equal(r.grad, est.grad)


PROTOTYPE_NOTICE = ("Synchronization debug mode is a prototype feature and does not yet detect "
                    "all synchronizing operations")


def _fake_cuda(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """torch.cuda's sync debug mode emulated on the CPU: set_sync_debug_mode gives torch's
    one-time prototype notice on its first call (located in set_sync_debug_mode, as torch's
    is), synchronize does nothing. Returns the modes set, in order."""
    modes: list[str] = []

    def set_sync_debug_mode(mode: str) -> None:
        if not modes:
            warnings.warn(PROTOTYPE_NOTICE, UserWarning, stacklevel=1)
        modes.append(mode)

    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", set_sync_debug_mode)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    return modes


def _syncing_op() -> None:
    """A stand-in for a synchronizing CUDA call: torch's warning, located at the caller."""
    warnings.warn(cgs.SYNC_WARNING, UserWarning, stacklevel=2)


def test_gpu_check_does_not_charge_the_first_piece_for_the_debug_mode_notice(
        monkeypatch: pytest.MonkeyPatch):
    """The H100 run's false positive: the first piece checked was charged a "sync" at
    set_sync_debug_mode, torch's prototype notice. Only torch's sync text counts now."""
    modes = _fake_cuda(monkeypatch)
    caught: list[warnings.WarningMessage] = []
    record = warnings.catch_warnings

    class Recording(record):  # the checker's own catch_warnings, whose list we keep
        def __enter__(self):
            got = super().__enter__()
            caught.append(got)
            return got

    monkeypatch.setattr(cgs.warnings, "catch_warnings", Recording)
    first = cgs.gpu_check(lambda: None)
    assert modes == ["warn", "default"]
    (inside,) = caught
    assert [str(w.message) for w in inside] == [PROTOTYPE_NOTICE]  # the checker saw the notice
    assert "synchroniz" in PROTOTYPE_NOTICE  # which the old loose match counted as a sync
    assert first.clean and first.describe() == "no sync"
    assert cgs.gpu_check(lambda: None).describe() == "no sync"  # the second piece as before


def test_gpu_check_still_reports_a_sync_with_its_line(monkeypatch: pytest.MonkeyPatch):
    _fake_cuda(monkeypatch)

    def piece() -> None:
        _syncing_op()  # the injected sync

    v = cgs.gpu_check(piece)
    assert not v.clean and v.problem.startswith(f"SYNC at {HERE}:") and "in piece" in v.problem
    assert "_syncing_op()" in v.problem and len(v.syncs) == 1
    ok = cgs.gpu_check(piece, {(HERE, "piece"): 1}, steps=1)  # an allowed read-back
    assert ok.clean and "known read-back (1x" in ok.describe()
