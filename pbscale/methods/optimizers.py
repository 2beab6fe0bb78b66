"""The optimizers of mask logits on the CPU (``--mask-opt``, ``--optimizer``): RMSprop and SGD
without ``torch.optim.Optimizer``, whose first call (``add_param_group`` in its constructor,
``step``) imports ``torch._dynamo``, the compiler, which a run does not use: 1.0-1.5 s of CPU
and about 65 MiB at the start of every run on this CPU (docs/measurements.md, "The fixed cost
of a run").

Each computes what ``torch.optim``'s class computes on the CPU (its single-tensor
implementation: the same tensor operations in the same order, so the same numbers bit for bit)
and keeps what it keeps: ``param_groups`` (the loop's learning-rate schedules act on them),
``state``, a ``state_dict`` of the same form (a checkpoint written by either loads into the
other), ``zero_grad`` and ``register_step_pre_hook`` (torchrun's gradient average). A parameter
group with ``foreach=True`` (the multi-tensor path a GPU takes by default, as
``benchmarks.check_gpu_sync --emulate`` sets it) steps through torch's functional ``rmsprop``
or ``sgd``. Elsewhere than on the CPU (CUDA graphs make the step ``capturable``),
:func:`mask_optimizer` returns torch's own class.
"""

from __future__ import annotations

import copy
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from .registry import OPTIMIZERS


def scalar_dtype() -> torch.dtype:
    """The dtype of an optimizer's step counter (torch's rule: float64 under a float64
    default dtype, else float32)."""
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


class LogitsOptimizer:
    """What RMSprop and SGD share: one parameter group of ``params`` with the class's
    defaults, per-parameter ``state``, step pre-hooks, ``zero_grad``, ``state_dict`` and
    ``load_state_dict`` in ``torch.optim.Optimizer``'s form."""

    #: The defaults of the class's parameter groups, in torch's order.
    DEFAULTS: dict[str, Any] = {}

    def __init__(self, params: Iterable[torch.Tensor], **settings: Any) -> None:
        params = list(params)
        if not params:
            raise ValueError("optimizer got an empty parameter list")
        unknown = set(settings) - set(self.DEFAULTS)
        if unknown:
            raise TypeError(f"unexpected settings {sorted(unknown)}")
        if settings.get("lr", 0.0) < 0:
            raise ValueError(f"Invalid learning rate: {settings['lr']}")
        self.defaults = {**self.DEFAULTS, **settings}
        self.state: defaultdict = defaultdict(dict)
        self.param_groups: list[dict] = [{"params": params, **self.defaults}]
        self.pre_hooks: OrderedDict = OrderedDict()

    def register_step_pre_hook(self, hook: Callable) -> RemovableHandle:
        """``hook(optimizer, args, kwargs)`` before every step (as torch calls it)."""
        handle = RemovableHandle(self.pre_hooks)
        self.pre_hooks[handle.id] = hook
        return handle

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    if p.grad.grad_fn is not None:
                        p.grad.detach_()
                    else:
                        p.grad.requires_grad_(False)
                    p.grad.zero_()

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One update of every parameter with a gradient (``closure``: re-evaluates the loss,
        whose value is returned)."""
        for hook in list(self.pre_hooks.values()):
            hook(self, (), {})
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        with torch.no_grad():
            for group in self.param_groups:
                if not isinstance(group["lr"], (int, float)):
                    raise TypeError("the learning rate is a number here; use torch.optim for a "
                                    "tensor learning rate")
                with_grad = [p for p in group["params"] if p.grad is not None]
                for p in with_grad:
                    if p.grad.is_sparse or p.is_complex():
                        raise RuntimeError(f"{type(self).__name__} here takes dense real "
                                           "parameters; use torch.optim")
                self.update(group, with_grad)
        return loss

    def update(self, group: dict, params: list[torch.Tensor]) -> None:
        """The class's update of ``params`` (those of ``group`` with a gradient)."""
        raise NotImplementedError

    def state_dict(self) -> dict:
        """{"state": {index: state}, "param_groups": [settings with "params": indices]}, as
        ``torch.optim.Optimizer.state_dict`` packs them."""
        index: dict[int, int] = {}
        groups = []
        for group in self.param_groups:
            packed = {k: v for k, v in group.items() if k != "params"}
            index.update({id(p): i for i, p in enumerate(group["params"], len(index))
                          if id(p) not in index})
            packed["params"] = [index[id(p)] for p in group["params"]]
            groups.append(packed)
        state = {index[id(p)] if isinstance(p, torch.Tensor) else p: s
                 for p, s in self.state.items()}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a :meth:`state_dict` (this class's or torch's): state tensors cast to their
        parameter's dtype and device (the step counter as it is), the saved settings of each
        group with this optimizer's parameters."""
        groups = self.param_groups
        saved = copy.deepcopy(state_dict["param_groups"])
        if len(groups) != len(saved):
            raise ValueError("loaded state dict has a different number of parameter groups")
        if any(len(g["params"]) != len(s["params"]) for g, s in zip(groups, saved)):
            raise ValueError("loaded state dict contains a parameter group that doesn't match "
                             "the size of optimizer's group")
        params = {old: p for g, s in zip(groups, saved) for old, p in zip(s["params"],
                                                                         g["params"])}
        exact_step = {old: bool(s.get("capturable") or s.get("fused"))
                      for s in saved for old in s["params"]}
        state: defaultdict = defaultdict(dict)
        for k, v in state_dict["state"].items():
            if k in params:
                p = params[k]
                state[p] = {key: _cast(p, key, value, exact_step[k]) for key, value in v.items()}
            else:
                state[k] = v
        for g, s in zip(groups, saved):
            s["params"] = g["params"]
            for k, v in self.DEFAULTS.items():
                s.setdefault(k, v)
        for s in saved:
            for p in s["params"]:
                st = state.get(p)
                if st and "step" in st and not torch.is_tensor(st["step"]):
                    st["step"] = torch.tensor(float(st["step"]), dtype=scalar_dtype())
        self.state, self.param_groups = state, saved


def _cast(p: torch.Tensor, key: str, value: Any, device_step: bool) -> Any:
    """A loaded state value for parameter p (torch's rule): tensors to p's dtype (floating p)
    and device, the step counter as it is (``device_step``, a capturable or fused group's:
    float32 on p's device); containers entry by entry."""
    if isinstance(value, torch.Tensor):
        if key == "step":
            return value.to(dtype=torch.float32, device=p.device) if device_step else value
        return (value.to(dtype=p.dtype, device=p.device) if p.is_floating_point()
                else value.to(device=p.device))
    if isinstance(value, dict):
        return {k: _cast(p, k, v, device_step) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(p, key, v, device_step) for v in value)
    return value


class RMSprop(LogitsOptimizer):
    """``torch.optim.RMSprop`` on the CPU (module docstring): square_avg = alpha square_avg +
    (1 - alpha) g^2, then p -= lr g / (sqrt(square_avg) + eps) (with torch's weight decay,
    momentum, centering and maximize)."""

    DEFAULTS = {"lr": 1e-2, "momentum": 0, "alpha": 0.99, "eps": 1e-8, "centered": False,
                "weight_decay": 0, "capturable": False, "foreach": None, "maximize": False,
                "differentiable": False}

    def update(self, group: dict, params: list[torch.Tensor]) -> None:
        for p in params:
            state = self.state[p]
            if len(state) == 0:
                state["step"] = torch.zeros((), dtype=scalar_dtype())
                state["square_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                if group["momentum"] > 0:
                    state["momentum_buffer"] = torch.zeros_like(
                        p, memory_format=torch.preserve_format)
                if group["centered"]:
                    state["grad_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        if group["foreach"]:
            self.torch_update(group, params)
            return
        lr, alpha, eps = group["lr"], group["alpha"], group["eps"]
        momentum, decay = group["momentum"], group["weight_decay"]
        for p in params:
            state = self.state[p]
            grad = p.grad if not group["maximize"] else -p.grad
            square_avg = state["square_avg"]
            state["step"] += 1
            if decay != 0:
                grad = grad.add(p, alpha=decay)
            square_avg.mul_(alpha).addcmul_(grad, grad, value=1 - alpha)
            if group["centered"]:
                grad_avg = state["grad_avg"]
                grad_avg.lerp_(grad, 1 - alpha)
                avg = square_avg.addcmul(grad_avg, grad_avg, value=-1).sqrt_()
            else:
                avg = square_avg.sqrt()
            avg = avg.add_(eps)
            if momentum > 0:
                buf = state["momentum_buffer"]
                buf.mul_(momentum).addcdiv_(grad, avg)
                p.add_(buf, alpha=-lr)
            else:
                p.addcdiv_(grad, avg, value=-lr)

    def torch_update(self, group: dict, params: list[torch.Tensor]) -> None:
        """torch's functional RMSprop on ``params`` (a group that asks for foreach)."""
        from torch.optim.rmsprop import rmsprop

        st = [self.state[p] for p in params]
        rmsprop(params, [p.grad for p in params], [s["square_avg"] for s in st],
                [s["grad_avg"] for s in st if "grad_avg" in s],
                [s["momentum_buffer"] for s in st if "momentum_buffer" in s],
                [s["step"] for s in st], foreach=True, maximize=group["maximize"],
                differentiable=group["differentiable"], capturable=group["capturable"],
                has_complex=False, lr=group["lr"], alpha=group["alpha"], eps=group["eps"],
                weight_decay=group["weight_decay"], momentum=group["momentum"],
                centered=group["centered"])


class SGD(LogitsOptimizer):
    """``torch.optim.SGD`` on the CPU (module docstring): p -= lr g (with torch's weight decay,
    momentum, dampening, Nesterov and maximize)."""

    DEFAULTS = {"lr": 1e-3, "momentum": 0, "dampening": 0, "weight_decay": 0,
                "nesterov": False, "maximize": False, "foreach": None, "differentiable": False,
                "fused": None}

    def update(self, group: dict, params: list[torch.Tensor]) -> None:
        momentum = group["momentum"]
        bufs = [self.state[p].get("momentum_buffer") for p in params] if momentum != 0 else []
        if group["foreach"]:
            from torch.optim.sgd import sgd

            sgd(params, [p.grad for p in params], bufs or [None] * len(params),
                weight_decay=group["weight_decay"], momentum=momentum, lr=group["lr"],
                dampening=group["dampening"], nesterov=group["nesterov"],
                maximize=group["maximize"], has_sparse_grad=False, foreach=True)
        else:
            lr, decay, dampening = group["lr"], group["weight_decay"], group["dampening"]
            for i, p in enumerate(params):
                grad = p.grad if not group["maximize"] else -p.grad
                if decay != 0:
                    grad = grad.add(p, alpha=decay)
                if momentum != 0:
                    buf = bufs[i]
                    if buf is None:
                        buf = bufs[i] = grad.detach().clone()
                    else:
                        buf.mul_(momentum).add_(grad, alpha=1 - dampening)
                    grad = grad.add(buf, alpha=momentum) if group["nesterov"] else buf
                p.add_(grad, alpha=-lr)
        if momentum != 0:
            for p, buf in zip(params, bufs):
                self.state[p]["momentum_buffer"] = buf


#: The optimizers of this module by the names of :data:`pbscale.methods.registry.OPTIMIZERS`.
CPU_OPTIMIZERS: dict[str, type[LogitsOptimizer]] = {"rmsprop": RMSprop, "sgd": SGD}


def mask_optimizer(name: str, params: list[torch.Tensor], lr: float) -> Any:
    """The optimizer ``name`` (:data:`pbscale.methods.registry.OPTIMIZERS`) over ``params``
    with learning rate ``lr``: this module's on the CPU, torch's elsewhere."""
    if all(p.device.type == "cpu" for p in params) and name in CPU_OPTIMIZERS:
        return CPU_OPTIMIZERS[name](params, lr=lr)
    return OPTIMIZERS[name](params, lr=lr)


__all__ = ["CPU_OPTIMIZERS", "LogitsOptimizer", "RMSprop", "SGD", "mask_optimizer",
           "scalar_dtype"]
