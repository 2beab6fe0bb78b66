"""The mask logits' optimizers on the CPU (:mod:`pbscale.methods.optimizers`) against
``torch.optim``: the same parameters and state bit for bit over many steps (every setting of
RMSprop and SGD, learning rates changed between steps, foreach too), the same ``state_dict``
(each loads the other's and goes on identically), zero_grad, step pre-hooks; and a run
imports no ``torch._dynamo``."""

import io
import subprocess
import sys

import pytest
import torch

from pbscale.methods.optimizers import SGD, RMSprop, mask_optimizer

SETTINGS = {
    RMSprop: [{}, {"alpha": 0.9, "eps": 1e-6}, {"weight_decay": 0.01}, {"momentum": 0.5},
              {"centered": True}, {"maximize": True},
              {"momentum": 0.3, "centered": True, "weight_decay": 0.1}],
    SGD: [{}, {"momentum": 0.9}, {"momentum": 0.9, "nesterov": True},
          {"momentum": 0.5, "dampening": 0.2, "weight_decay": 0.01}, {"maximize": True}],
}
CASES = [(cls, s) for cls, settings in SETTINGS.items() for s in settings]
TORCH = {RMSprop: torch.optim.RMSprop, SGD: torch.optim.SGD}


def pair(cls, settings, dtype=torch.float32, n=1000, seed=0):
    g = torch.Generator().manual_seed(seed)
    start = torch.randn(n, generator=g, dtype=dtype)
    a, b = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    return a, b, cls([a], lr=0.05, **settings), TORCH[cls]([b], lr=0.05, **settings)


def steps(params_opts, count, seed=1, lrs=None):
    """``count`` steps of each (param, optimizer) on the same gradients (the gradient a
    function of the parameter, so that a difference would grow), lr changed where asked."""
    g = torch.Generator().manual_seed(seed)
    for i in range(count):
        noise = torch.randn(params_opts[0][0].shape, generator=g, dtype=params_opts[0][0].dtype)
        for p, opt in params_opts:
            if lrs is not None and i in lrs:
                for group in opt.param_groups:
                    group.setdefault("initial_lr", group["lr"])
                    group["lr"] = group["initial_lr"] * lrs[i]
            opt.zero_grad()
            loss = (p * noise).sum() + (p ** 2).sum() * 0.1
            loss.backward()
            opt.step()


def same_state(a_opt, b_opt):
    sa, sb = a_opt.state_dict(), b_opt.state_dict()
    assert sa["param_groups"] == sb["param_groups"]
    assert sa["state"].keys() == sb["state"].keys()
    for k in sa["state"]:
        assert sa["state"][k].keys() == sb["state"][k].keys()
        for key, v in sa["state"][k].items():
            w = sb["state"][k][key]
            assert (v is None and w is None) or (v.dtype == w.dtype and torch.equal(v, w)), key


@pytest.mark.parametrize("cls, settings", CASES)
def test_steps_equal_torch_bit_for_bit(cls, settings):
    a, b, ours, theirs = pair(cls, settings)
    steps([(a, ours), (b, theirs)], 60, lrs={20: 0.1, 40: 0.01})
    assert torch.equal(a, b) and not torch.equal(a, pair(cls, settings)[0])
    same_state(ours, theirs)


@pytest.mark.parametrize("cls", [RMSprop, SGD])
def test_float64_and_foreach(cls):
    a, b, ours, theirs = pair(cls, SETTINGS[cls][1], dtype=torch.float64)
    steps([(a, ours), (b, theirs)], 30)
    assert torch.equal(a, b)
    a, b, ours, theirs = pair(cls, {**SETTINGS[cls][1], "foreach": True})
    steps([(a, ours), (b, theirs)], 30)
    assert torch.equal(a, b)
    same_state(ours, theirs)


@pytest.mark.parametrize("cls, settings", CASES)
def test_state_dicts_load_across(cls, settings):
    """Ours after 25 steps loaded into torch's, torch's into ours (through torch.save): both
    pairs go on as one."""
    a, b, ours, theirs = pair(cls, settings)
    steps([(a, ours), (b, theirs)], 25, lrs={10: 0.5})

    def through_file(sd):
        buf = io.BytesIO()
        torch.save(sd, buf)
        buf.seek(0)
        return torch.load(buf, weights_only=True)

    a2, b2, ours2, theirs2 = pair(cls, settings, seed=5)
    with torch.no_grad():
        a2.copy_(b)
        b2.copy_(a)
    ours2.load_state_dict(through_file(theirs.state_dict()))
    theirs2.load_state_dict(through_file(ours.state_dict()))
    same_state(ours2, theirs2)
    steps([(a, ours), (b, theirs), (a2, ours2), (b2, theirs2)], 25, seed=7)
    assert torch.equal(a, b) and torch.equal(a, a2) and torch.equal(a, b2)
    same_state(ours2, theirs)


def test_load_refuses_another_shape_and_hooks_and_zero_grad():
    a, _, ours, _ = pair(RMSprop, {})
    other = RMSprop([torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(3))])
    with pytest.raises(ValueError, match="doesn't match"):
        ours.load_state_dict(other.state_dict())
    calls = []
    handle = ours.register_step_pre_hook(lambda opt, args, kwargs: calls.append(opt))
    a.grad = torch.ones_like(a)
    ours.step()
    assert calls == [ours]
    handle.remove()
    ours.step()
    assert calls == [ours]
    ours.zero_grad(set_to_none=False)
    assert a.grad is not None and not a.grad.any()
    ours.zero_grad()
    assert a.grad is None
    with pytest.raises(ValueError, match="empty parameter list"):
        SGD([])


def test_mask_optimizer_is_ours_on_the_cpu():
    p = torch.nn.Parameter(torch.zeros(4))
    assert type(mask_optimizer("rmsprop", [p], 0.1)) is RMSprop
    assert type(mask_optimizer("sgd", [p], 0.1)) is SGD
    meta = torch.nn.Parameter(torch.zeros(4, device="meta"))
    assert type(mask_optimizer("rmsprop", [meta], 0.1)) is torch.optim.RMSprop


def test_a_supermask_run_imports_no_dynamo(tmp_path):
    """A supermask ARMS run (two steps, its evaluation and files) and a regression CP run
    never import torch._dynamo: no torch.optim.Optimizer is made or stepped."""
    code = ("import sys\n"
            "from pbscale import prune, regress\n"
            f"prune.main(['--synthetic', '64', '--method', 'arms', '--n', '4', '--epochs', '1',"
            f" '--max-batches', '2', '--batch-size', '16', '--val-size', '16', '--quiet',"
            f" '--out', {str(tmp_path / 'p')!r}])\n"
            f"regress.main(['--method', 'cp', '--epochs', '1', '--out', "
            f"{str(tmp_path / 'r')!r}])\n"
            "print('torch._dynamo' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip().splitlines()[-1] == "False", out.stderr[-2000:]
