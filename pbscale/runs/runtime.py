"""The torch set-up every pbscale tool shares: the device of ``--device`` and the thread count
of ``--threads``, each refused in one line (:class:`pbexact.errors.PBInputError`) when it
cannot be had."""

from __future__ import annotations

import torch

from pbexact.cli import MAX_THREADS
from pbexact.errors import PBInputError

#: The device types pbscale runs on (``--device``); ``auto`` picks CUDA when a GPU is visible.
DEVICE_TYPES = ("cpu", "cuda")


def available_devices() -> list[str]:
    """The values ``--device`` takes on this machine: ``cpu``, ``auto``, and with GPUs ``cuda``
    and ``cuda:0`` ... ``cuda:K-1``."""
    out = ["cpu", "auto"]
    if torch.cuda.is_available():
        out += ["cuda", *(f"cuda:{i}" for i in range(torch.cuda.device_count()))]
    return out


def resolve_device(device: str) -> torch.device:
    """The torch device of ``--device``: ``auto`` (CUDA when visible), ``cpu``, ``cuda``,
    ``cuda:K``; anything else (an unknown name, ``mps``, ``meta``, a GPU that is not there) is
    a one-line :class:`PBInputError` naming the devices available here."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    here = ", ".join(available_devices())
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise PBInputError(f"unknown device {device!r}; use one of {here}") from None
    if dev.type not in DEVICE_TYPES:
        raise PBInputError(f"--device {device}: pbscale runs on the CPU or a CUDA GPU, not "
                           f"{dev.type}; use one of {here}")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise PBInputError("--device cuda was asked for but no GPU is visible; use --device "
                               "cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise PBInputError(f"--device {device}: there is no GPU {dev.index}; use one of "
                               f"{here}")
    return dev


def set_threads(threads: int | None) -> None:
    """Set torch's intra-op thread count (``--threads``); ``None`` leaves torch's default."""
    if threads is not None:
        if not 1 <= threads <= MAX_THREADS:
            raise PBInputError(f"--threads must be from 1 to {MAX_THREADS:,} (torch threads per "
                               f"process), got {threads:,}; give at most the machine's cores")
        torch.set_num_threads(threads)
