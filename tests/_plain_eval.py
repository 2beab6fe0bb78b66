"""Test accuracy and mean loss of a network in plain PyTorch (no pbscale code in the loop), the
independent check that a saved pruned network reproduces the metrics a run reported."""

import torch
from torch import nn


def plain_test_metrics(net: nn.Module, data, batch_size: int = 7) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) of ``net`` over ``data``'s test split, in batches of
    ``batch_size``."""
    correct = loss = 0.0
    with torch.no_grad():
        for x, y in data.batches("test", batch_size):
            out = net(x)
            correct += float((out.argmax(1) == y).sum())
            loss += float(nn.functional.cross_entropy(out, y, reduction="sum"))
    n = len(data.test)
    return correct / n, loss / n
