"""The run loop (pbscale.runs.loop) and masks on trainable networks (pbscale.forward.masks): joint
gradients through the surrogate loss, BatchNorm running statistics and dropout under k masks,
dynamic weight rescaling, schedules, warm-up, freezing, SIGTERM and resume."""

from __future__ import annotations

import copy
import os
import signal
import warnings

import pytest
import torch
from _masked_reference import forward_one
from torch import nn

from pbexact.errors import PBInputError, RunInterrupted
from pbscale import methods as M
from pbscale.forward.masks import MaskedModule
from pbscale.forward.rescale import rescaled_weight
from pbscale.runs import io
from pbscale.runs.contracts import ResumeWarning
from pbscale.runs.loop import EvalContext, LoopConfig, Method, Task, run, run_folder


def conv_net(seed: int = 0, dropout: float = 0.0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3), nn.ReLU(), nn.Dropout(dropout),
                         nn.Flatten(), nn.Linear(3 * 4 * 4, 3))


def xent(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy per mask: (k, B, C), (B,) -> (k,)."""
    return torch.stack([nn.functional.cross_entropy(o, y) for o in out])


class ToyTask:
    """A small conv net classifying random images (the loop's test task)."""

    name = "toy"

    def __init__(self, joint: bool, seed: int = 0, dropout: float = 0.0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(24, 2, 6, 6, generator=g)
        self.y = torch.randint(0, 3, (24,), generator=g)
        self.net = conv_net(seed, dropout)
        self.masked = MaskedModule(self.net, train_weights=joint, weight_hook=rescaled_weight)
        self.d = self.masked.d
        self.steps_per_epoch = 3
        self.joint = joint

    def config(self) -> dict:
        return {"name": self.name, "joint": self.joint}

    def weights(self) -> list:
        return list(self.net.parameters()) if self.joint else []

    def epoch_order(self, generator):
        return torch.randperm(24, generator=generator)

    def batch_loss(self, order, i):
        idx = order[i * 8 : (i + 1) * 8]
        self.net.train()
        return self.masked.loss_fn(self.x[idx], self.y[idx], xent)

    def evaluate(self, ctx: EvalContext) -> dict:
        self.net.eval()
        with torch.no_grad():
            z = ctx.mask[None] if ctx.mask is not None else ctx.method.sample_masks(2)
            loss = float(self.masked.loss_fn(self.x, self.y, xent)(z).mean())
        self.net.train()
        return {"loss": loss, "theta_mean": float(ctx.method.theta().mean()),
                "mask_lr": ctx.method.opt.param_groups[0]["lr"],
                "w0": float(self.net[0].weight.detach().flatten()[0]),
                "r0": float(ctx.method.r.detach()[0]), "phase": ctx.phase}

    def state_dict(self) -> dict:
        return {"buffers": {k: v.clone() for k, v in self.net.named_buffers()}}

    def load_state_dict(self, state: dict) -> None:
        with torch.no_grad():
            for k, v in self.net.named_buffers():
                v.copy_(state["buffers"][k])


def test_protocols_are_met():
    task = ToyTask(joint=True)
    trainer = M.MaskTrainer(M.MethodConfig(method="loorf", n=2), task.d, 10)
    assert isinstance(task, Task) and isinstance(trainer, Method)


def test_k_masks_at_once_equal_one_at_a_time_with_batchnorm_running_stats():
    net = conv_net()
    net.train()
    mm = MaskedModule(net, train_weights=True)
    x = torch.randn(5, 2, 6, 6)
    z = (torch.rand(3, mm.d, generator=torch.Generator().manual_seed(1)) < 0.6).float()
    ref_nets = [copy.deepcopy(net) for _ in range(3)]
    out = mm.forward(z, x)
    ref = []
    for j, rn in enumerate(ref_nets):
        mj = MaskedModule(rn, train_weights=True)
        ref.append(forward_one(mj, z[j], x))
    torch.testing.assert_close(out, torch.stack(ref))
    # running stats: the mean over the k masks of their per-mask updates
    mean_ref = torch.stack([rn[1].running_mean for rn in ref_nets]).mean(0)
    var_ref = torch.stack([rn[1].running_var for rn in ref_nets]).mean(0)
    torch.testing.assert_close(net[1].running_mean, mean_ref)
    torch.testing.assert_close(net[1].running_var, var_ref)
    assert int(net[1].num_batches_tracked) == 1
    # weight gradients of the summed outputs = sum of per-mask gradients
    out.sum().backward()
    total = torch.zeros_like(net[0].weight)
    for j in range(3):
        rn_copy = copy.deepcopy(net)
        rn_copy.zero_grad()
        forward_one(MaskedModule(rn_copy, train_weights=True), z[j], x).sum().backward()
        total += rn_copy[0].weight.grad
    torch.testing.assert_close(net[0].weight.grad, total)
    # eval mode: running statistics used, not changed
    net.eval()
    before = net[1].running_mean.clone()
    mm.forward(z, x)
    assert torch.equal(before, net[1].running_mean)


def test_supermask_weights_stay_detached_and_dropout_differs_per_mask():
    net = conv_net(dropout=0.5)
    mm = MaskedModule(net)
    z = torch.ones(2, mm.d)
    out = mm.forward(z, torch.randn(4, 2, 6, 6))
    assert not out.requires_grad
    assert not torch.equal(out[0], out[1])  # independent dropout units per mask
    net.eval()
    out = mm.forward(z, torch.randn(4, 2, 6, 6))
    assert torch.equal(out[0], out[1])


def test_rescaled_weight_forward_backward_and_zero_guard():
    w = torch.randn(4, 3)
    m = torch.tensor([[1.0, 0, 1], [0, 0, 1], [1, 1, 1], [0, 0, 0]]).expand(2, 4, 3).clone()
    m[1] = 0.0
    m.requires_grad_(True)
    out = rescaled_weight("w", w, m)
    mean = 6 / 12
    torch.testing.assert_close(out[0], w * m[0].detach() / mean)
    assert torch.equal(out[1], torch.zeros(4, 3))  # all-zero mask: no division by zero
    out.sum().backward()
    torch.testing.assert_close(m.grad[0], w / mean)  # the mean is a constant in backward
    torch.testing.assert_close(m.grad[1], w)


@pytest.mark.parametrize("method", ["loorf", "arms", "cp"])
def test_surrogate_gradients_in_logits_and_weights(method):
    task = ToyTask(joint=True)
    f = task.batch_loss(torch.arange(24), 0)
    tr = M.MaskTrainer(M.MethodConfig(method=method, n=4, seed=3), task.d, 10)
    state, stream = tr.generator.get_state(), tr.stream.state_dict()  # MC draws: the stream
    buffers = copy.deepcopy(dict(task.net.named_buffers()))
    value, loss = tr.surrogate(f, weights=True)
    value.backward()
    g_r = tr.r.grad.clone()
    g_w = task.net[0].weight.grad.clone()
    # the same step recomputed directly: logits by the estimate, weights by the mean loss
    task.net.zero_grad()
    with torch.no_grad():
        for k, b in task.net.named_buffers():
            b.copy_(buffers[k])
    tr.generator.set_state(state)
    tr.stream.load_state_dict(stream)
    est = tr.gradient(f)
    torch.testing.assert_close(g_r, est.grad)
    with torch.no_grad():
        for k, b in task.net.named_buffers():
            b.copy_(buffers[k])
    tr.generator.set_state(state)
    tr.stream.load_state_dict(stream)
    if method == "cp":
        z = torch.sigmoid(tr.r.detach() / tr.temperature())[None]
    else:
        theta = tr.param.theta(tr.r.detach())
        # the unfused samplers on the same stream: the masks the fused step evaluated
        z = (M.BernoulliSampler(theta, tr.stream).next(4) if method == "loorf"
             else M.CopulaSampler(theta, 4, tr.stream).next(4))
    f(z).mean().backward()
    torch.testing.assert_close(task.net[0].weight.grad, g_w)
    assert g_w.abs().sum() > 0


def test_hybrid_methods_refuse_weight_training():
    task = ToyTask(joint=True)
    tr = M.MaskTrainer(M.MethodConfig(method="st", n=2), task.d, 10)
    with pytest.raises(PBInputError, match="cannot train network weights"):
        tr.surrogate(task.batch_loss(torch.arange(24), 0), weights=True)


def _run(tmp_path, loop, joint=True, method="loorf", step_hook=None, dropout=0.0):
    task = ToyTask(joint=joint, dropout=dropout)
    tr = M.MaskTrainer(M.MethodConfig(method=method, n=2, seed=loop.seed), task.d,
                       loop.epochs * task.steps_per_epoch)
    wopt = torch.optim.SGD(task.weights(), lr=0.05, momentum=0.9) if joint else None
    return run(task, tr, loop, tmp_path, weight_optimizer=wopt, progress=False,
               step_hook=step_hook)


def test_schedules_warmup_and_freezing(tmp_path):
    loop = LoopConfig(epochs=10, seed=2, mask_milestones=(0.4, 0.6), mask_gamma=0.5,
                      mask_warmup=0.2, freeze_masks=0.8)
    rows = io.read_csv(_run(tmp_path, loop) / "metrics.csv")
    assert [r["phase"] for r in rows] == (["warmup"] * 3 + ["train"] * 6 + ["frozen"] * 2)
    # the evaluation after epoch e reports the rate used during epoch e - 1
    assert [r["mask_lr"] for r in rows[1:]] == [0.1] * 4 + [0.05] * 2 + [0.025] * 4
    assert rows[1]["r0"] == rows[2]["r0"] == rows[0]["r0"]  # masks untrained in warm-up
    assert rows[1]["w0"] != rows[0]["w0"]  # weights train in warm-up
    assert rows[9]["r0"] == rows[10]["r0"] == rows[8]["r0"]  # masks frozen
    assert rows[9]["w0"] != rows[10]["w0"]
    assert rows[3]["r0"] != rows[4]["r0"]


def test_phase_fractions_give_at_least_one_epoch(tmp_path):
    """A phase given a fraction > 0 of the epochs lasts at least one epoch (while the longest
    phase can spare one); otherwise the counts are the rounded boundaries."""
    assert LoopConfig(5, mask_warmup=0.1).phase_epochs() == (1, 4, 0)  # round(0.5) = 0 before
    assert LoopConfig(5, mask_warmup=0.1, freeze_masks=0.8).phase_epochs() == (1, 3, 1)
    assert LoopConfig(10, mask_warmup=0.2, freeze_masks=0.8).phase_epochs() == (2, 6, 2)
    assert LoopConfig(2, mask_warmup=0.1, freeze_masks=0.8).phase_epochs() == (1, 1, 0)
    assert LoopConfig(1, mask_warmup=0.1).phase_epochs() == (0, 1, 0)
    assert LoopConfig(4, freeze_masks=1.0).phase_epochs() == (0, 4, 0)
    for E in range(1, 40):
        for w in (0.0, 0.01, 0.1, 0.25, 0.5):
            for f in (None, w, 0.5 + w / 2, 0.8, 0.99, 1.0):
                loop = LoopConfig(E, mask_warmup=w, freeze_masks=f)
                counts = loop.phase_epochs()
                fr = (w, (1.0 if f is None else f) - w, 1 - (1.0 if f is None else f))
                rounded = (round(w * E), round((1.0 if f is None else f) * E) - round(w * E),
                           E - round((1.0 if f is None else f) * E))
                assert sum(counts) == E and min(counts) >= 0
                if E >= 3:  # enough epochs: every positive fraction gets one
                    assert all(c >= 1 for c, x in zip(counts, fr) if x > 0), (E, w, f, counts)
                if all(c >= 1 for c, x in zip(rounded, fr) if x > 0):
                    assert counts == rounded
                phases = [loop.phase(e) for e in range(E)]
                assert phases == (["warmup"] * counts[0] + ["train"] * counts[1]
                                  + ["frozen"] * counts[2])
                assert loop.mask_epochs() == counts[1]
    # the loop follows the rule: 5 joint epochs with mask_warmup 0.1 warm up once
    rows = io.read_csv(_run(tmp_path, LoopConfig(epochs=5, seed=0, mask_warmup=0.1))
                       / "metrics.csv")
    assert [r["phase"] for r in rows] == ["warmup"] * 2 + ["train"] * 4
    assert rows[1]["r0"] == rows[0]["r0"] and rows[2]["r0"] != rows[1]["r0"]


@pytest.mark.parametrize("dropout", [0.0, 0.5])
def test_sigterm_checkpoint_and_resume_give_the_same_numbers(tmp_path, dropout):
    """With dropout (torch's global generator) the resumed run must restore that generator's
    state from the checkpoint too."""
    loop = LoopConfig(epochs=4, seed=1, mask_warmup=0.25, freeze_masks=0.75,
                      weight_milestones=(0.5,))
    whole = _run(tmp_path / "whole", loop, method="arms", dropout=dropout)

    def term(epoch, i):
        if (epoch, i) == (2, 1):
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(RunInterrupted) as exc:
        _run(tmp_path / "cut", loop, method="arms", step_hook=term, dropout=dropout)
    assert exc.value.code == 143
    cfg = {k: v for k, v in io.read_json(whole / "config.json").items() if k != "info"}
    folder = run_folder(tmp_path / "cut", "toy", cfg)
    assert folder.name == whole.name
    assert not (folder / "summary.json").exists()
    state = torch.load(folder / "checkpoint.pt", weights_only=True)
    assert state["position"]["step"] == 2 and state["epoch"] == 2
    _run(tmp_path / "cut", loop, method="arms", dropout=dropout)

    def rows(path):
        return [{k: v for k, v in r.items() if not k.endswith("seconds")}
                for r in io.read_csv(path)]

    assert str(rows(folder / "metrics.csv")) == str(rows(whole / "metrics.csv"))
    assert not [p for p in os.listdir(folder) if p.endswith(".tmp")]


def test_a_step_that_does_not_end_is_cut_soon_after_a_signal(tmp_path, monkeypatch):
    """Issue 50: a SIGTERM during a step that would run for long (here a hook that waits 20 s,
    as a step with a huge --n did for 10 minutes) stops the run once the grace has passed
    (``STOP_GRACE``, or twice the longest step seen, at most ``STOP_GRACE_MAX``: here 0.2 to
    1 s), without waiting for the step: RunInterrupted saying no checkpoint was written,
    the checkpoint of epoch 1 intact; the rerun resumes from it and equals the uninterrupted
    run."""
    import time

    import pbscale.runs.loop as loop_module

    monkeypatch.setattr(loop_module, "STOP_GRACE", 0.2)
    monkeypatch.setattr(loop_module, "STOP_GRACE_MAX", 1.0)
    loop = LoopConfig(epochs=2, seed=1)
    whole = _run(tmp_path / "whole", loop)
    waited = []

    def long_step(epoch, i):
        if (epoch, i) == (1, 1):
            os.kill(os.getpid(), signal.SIGTERM)
            t0 = time.monotonic()
            while time.monotonic() - t0 < 20:  # a step that does not end soon
                time.sleep(0.01)
            waited.append(True)  # reached only if the signal was not acted on

    with pytest.raises(RunInterrupted, match=r"did not end within (0\.[2-9]\d*|1) s") as exc:
        _run(tmp_path / "cut", loop, step_hook=long_step)
    assert exc.value.code == 143 and not waited
    (folder,) = (tmp_path / "cut").iterdir()
    state = torch.load(folder / "checkpoint.pt", weights_only=True)
    assert state["epoch"] == 1 and state.get("position") is None  # epoch 1's, untouched
    _run(tmp_path / "cut", loop)

    def rows(path):
        return [{k: v for k, v in r.items() if not k.endswith("seconds")}
                for r in io.read_csv(path)]

    assert str(rows(folder / "metrics.csv")) == str(rows(whole / "metrics.csv"))


@pytest.mark.parametrize("old", ["missing", "none"])
def test_a_checkpoint_without_the_stream_resumes_with_one_warning(tmp_path, capsys, old):
    """A checkpoint whose method state holds no stream (written before the MC samples had one:
    no "stream" key; or on a GPU: None) resumes on the CPU from the fresh stream of the run's
    seed, saying so in one line that names the checkpoint: the epochs before the cut are the
    uninterrupted run's, those after it are not."""
    loop = LoopConfig(epochs=4, seed=1, mask_warmup=0.25, freeze_masks=0.75)
    whole = _run(tmp_path / "whole", loop, method="arms")

    def term(epoch, i):
        if (epoch, i) == (2, 1):
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(RunInterrupted):
        _run(tmp_path / "cut", loop, method="arms", step_hook=term)
    (folder,) = (tmp_path / "cut").iterdir()
    ckpt = folder / "checkpoint.pt"
    state = torch.load(ckpt, weights_only=True)
    assert state["method"]["stream"] is not None
    if old == "missing":
        del state["method"]["stream"]
    else:
        state["method"]["stream"] = None
    torch.save(state, ckpt)
    capsys.readouterr()
    _run(tmp_path / "cut", loop, method="arms")
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert lines[0] == (f"warning: resuming {ckpt}: {M.trainer.STREAM_NOT_RESUMED}; delete it "
                        "to start the run over")
    cut, ref = io.read_csv(folder / "metrics.csv"), io.read_csv(whole / "metrics.csv")
    assert [r["loss"] for r in cut[:3]] == [r["loss"] for r in ref[:3]]
    assert cut[3]["r0"] != ref[3]["r0"]  # epoch 3 drew other samples
    # the trainer warns any caller, and a state with its stream resumes silently
    tr = M.MaskTrainer(M.MethodConfig(method="arms", n=2, seed=1), 10, 10)
    with pytest.warns(ResumeWarning, match="no state of the MC samples' stream"):
        tr.load_state_dict({**tr.state_dict(), "stream": None})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tr.load_state_dict(tr.state_dict())


def test_a_cpu_checkpoints_stream_resumed_without_one_is_warned(tmp_path, capsys,
                                                                 monkeypatch):
    """Issue 50: a checkpoint written on the CPU (with the MC samples' counter stream) resumed
    by a run that has no stream (a GPU run; emulated here by a CPU trainer whose stream is
    removed) says so in one warning line naming the checkpoint; a3f3b10 dropped the stream
    silently."""
    tr = M.MaskTrainer(M.MethodConfig(method="arms", n=2, seed=1), 10, 10)
    state = tr.state_dict()
    assert state["stream"] is not None
    gpu_like = M.MaskTrainer(M.MethodConfig(method="arms", n=2, seed=1), 10, 10)
    gpu_like.stream = None
    with pytest.warns(ResumeWarning, match="holds the MC samples' CPU stream"):
        gpu_like.load_state_dict(state)
    # through the loop: the one warning line of a resumed run
    loop = LoopConfig(epochs=2, seed=1)

    def term(epoch, i):
        if (epoch, i) == (1, 1):
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(RunInterrupted):
        _run(tmp_path, loop, method="arms", step_hook=term)
    made = M.MaskTrainer.__init__

    def without_stream(self, *args, **kwargs):
        made(self, *args, **kwargs)
        self.stream = None

    monkeypatch.setattr(M.MaskTrainer, "__init__", without_stream)
    capsys.readouterr()
    _run(tmp_path, loop, method="arms")
    (ckpt,) = tmp_path.glob("*/checkpoint.pt")
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert lines == [f"warning: resuming {ckpt}: "
                     f"{M.trainer.STREAM_NOT_USED.format(device='cpu')}; delete it to start "
                     "the run over"], lines


def test_config_mismatch_is_refused_and_options_are_checked(tmp_path):
    loop = LoopConfig(epochs=1, seed=0)
    folder = _run(tmp_path, loop, joint=False)
    cfg = io.read_json(folder / "config.json")
    cfg["loop"]["seed"] = 5
    io.write_json(folder / "config.json", cfg)
    with pytest.raises(PBInputError, match="another configuration"):
        _run(tmp_path, loop, joint=False)
    for bad, words in [({"epochs": 0}, "epochs"), ({"epochs": 2, "mask_warmup": 2}, "warmup"),
                       ({"epochs": 2, "mask_milestones": (1.5,)}, "fractions"),
                       ({"epochs": 2, "mask_warmup": 0.5, "freeze_masks": 0.2}, "freeze")]:
        with pytest.raises(PBInputError, match=words):
            LoopConfig(**bad).validate()


def test_microworld_sgd_loop_numpy_and_torch():
    import numpy as np

    from pbexact.sgd import sgd

    seen = []
    r = sgd(np.array([[4.0], [-2.0]]), lambda step, r: 2 * r, 0.25, 3,
            project=lambda r: np.clip(r, -1.5, 10), log=lambda step, r: seen.append(step))
    # r <- clip(r - 0.25 * 2 r) = clip(r / 2): 4 -> 2 -> 1 -> 0.5; -2 -> -1 -> -0.5 -> -0.25
    np.testing.assert_allclose(r, [[0.5], [-0.25]])
    assert seen == [0, 1, 2, 3]
    t = sgd(torch.ones(3, requires_grad=True), lambda step, r: r * 0 + step, 1.0, range(3),
            project=torch.Tensor.detach)
    assert torch.equal(t, torch.tensor([0.0, 0.0, 0.0])) and not t.requires_grad


@pytest.mark.parametrize("hook", [None, rescaled_weight])
def test_mlp_fast_path_trains_weights_like_the_vmap_path(hook):
    from pbscale.regression.problem import mlp

    torch.manual_seed(0)
    net = mlp((3, 5, 4, 1)).double()
    nn.init.normal_(net[0].weight)
    mm = MaskedModule(net, train_weights=True, weight_hook=hook)
    assert mm._plan is not None  # the fast path applies
    x = torch.rand(6, 3, dtype=torch.float64)
    z = (torch.rand(4, mm.d, generator=torch.Generator().manual_seed(1)) < 0.7).double()
    grads = []
    for fwd in (mm.forward, mm.forward_vmap):
        net.zero_grad()
        out = fwd(z, x)
        (out ** 2).sum().backward()
        grads.append([p.grad.clone() for p in net.parameters()])
        if fwd == mm.forward:
            first = out.detach()
    torch.testing.assert_close(first, mm.forward_vmap(z, x).detach())
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)
    assert grads[0][0].abs().sum() > 0


@pytest.mark.parametrize("method, mode, epochs, phases", [
    ("arms", "joint", 5, (1, 3, 1)),  # MC joint: warm-up 0.1, freeze at 0.8
    ("cp", "joint", 5, (0, 4, 1)),
    ("cp", "supermask", 2, (0, 2, 0)),
])
def test_prune_counts_cp_and_mc_steps_with_the_loops_phase_rule(method, mode, epochs, phases):
    """pbscale.prune gives its method the mask-training steps of LoopConfig.mask_epochs()."""
    from pbscale.pruning import config as pconfig
    from pbscale.pruning import run as prun

    cfg = pconfig.PruneConfig(model="lenet", synthetic=24, epochs=epochs, max_batches=2,
                        batch_size=8, n=2, val_size=8, method=method, mode=mode)
    cfg, dev, data = prun.prepare(cfg)
    task, trainer, loop, _ = prun.build(cfg, data, dev)
    assert loop.phase_epochs() == phases
    assert trainer.total_steps == max(phases[1] * task.steps_per_epoch, 1)


@pytest.mark.parametrize("method", ["arms", "loorf", "disarm"])
def test_joint_surrogate_in_chunks_equals_one_chunk(method):
    """Joint training records each chunk's losses with their graph: chunks of 2 must give the
    weights the gradient of one chunk of n on the same samples (the samplers' streams do not
    depend on the chunking), so no chunk's saved masks may be changed by a later draw (the CPU
    float32 ARMS sampler keeps a step's draws in one buffer)."""
    grads = []
    for chunk in (2, 6):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 1))
        mm = MaskedModule(net, train_weights=True)
        x, y = torch.randn(8, 5), torch.randn(8, 1)
        trainer = M.MaskTrainer(M.MethodConfig(method=method, n=6, chunk=chunk, seed=3), mm.d, 5)
        value, _ = trainer.surrogate(mm.loss_fn(x, y), weights=True)
        value.backward()
        grads.append((trainer.r.grad.clone(), [p.grad.clone() for p in net.parameters()]))
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=1e-5, atol=1e-6)
    for a, b in zip(grads[0][1], grads[1][1]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_flush_denormals_only_while_the_loop_runs():
    """Subnormal floats are flushed to zero inside the block (CPU, where supported) and not
    after it, so nothing outside a run (the exact core's tail tests) sees the setting."""
    from pbscale.runs.loop import flush_denormals

    supported = torch.set_flush_denormal(True)
    torch.set_flush_denormal(False)
    x = torch.tensor([1e-40], dtype=torch.float32)  # subnormal in float32
    assert float(x * 1.0) != 0.0
    with flush_denormals(torch.device("cpu")):
        assert (float(x * 1.0) == 0.0) == supported
    assert float(x * 1.0) != 0.0
