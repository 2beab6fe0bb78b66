"""Reference values shared by the tests (exact-core issue): d=1, J(z) = (z - 0.49)^2, the variance
of the estimated derivative with respect to the sigmoid logit, by theta and (estimator, n); and
the earlier form of the copula sampler's stick-breaking, which the current one must equal."""

import math

import torch

D1_TABLE = ((0 - 0.49) ** 2, (1 - 0.49) ** 2)

D1_VARIANCES = {
    0.5: {("reinforce", 1): 1.56375e-2, ("loorf", 2): 2.5e-5, ("loorf", 4): 4.1667e-6,
          ("loorf", 10): 5.5556e-7, ("arms", 2): 0.0, ("arms", 4): 6.0780e-7,
          ("arms", 10): 1.2868e-7},
    0.3: {("reinforce", 1): 1.355903e-2, ("loorf", 2): 2.436e-5, ("loorf", 4): 6.3e-6,
          ("loorf", 10): 1.736e-6, ("arms", 2): 1.176e-5, ("arms", 4): 9.2906e-7,
          ("arms", 10): 5.2314e-7},
}


def earlier_stick_draw(theta: torch.Tensor, n: int, gen: torch.Generator, sizes: list[int],
                       row_loop: bool, uniforms) -> torch.Tensor:
    """The copula sampler's stick-breaking (`pbscale.methods.samplers.CopulaSampler` off its
    CPU float32 threshold path) as it was before the fewer-kernel form (commit daa5e4e): the
    bits of draws in chunks of ``sizes``, uniforms from ``uniforms(shape, gen)``; ``row_loop``:
    the running product by rows (the CPU form) or one cumprod (the GPU form)."""
    from pbexact.copula import branch_side, branch_threshold

    hi, m = branch_side(theta)
    c = branch_threshold(m, n)
    sign = hi.to(theta.dtype).mul_(2).sub_(1)
    bound = c.mul_(sign)
    q_prev, first, outs = sign.clone(), 1, []
    for k in sizes:
        s = torch.arange(first, first + k, dtype=theta.dtype, device=theta.device)
        per_row = (n - s).clamp_min(1).reciprocal_().view(k, 1)
        out = uniforms((k, theta.numel()), gen)
        L = out.log_().mul_(per_row)
        if first + k - 1 == n:
            L[-1] = -math.inf
        q = torch.exp(L)
        q[0].mul_(q_prev)
        if row_loop:
            for i in range(1, k):
                q[i].mul_(q[i - 1])
        else:
            q.cumprod_(0)
        D = torch.empty_like(L)
        torch.sub(q_prev, q[0], out=D[0])
        if k > 1:
            torch.sub(q[:-1], q[1:], out=D[1:])
        q_prev = q[-1].clone()
        outs.append(torch.le(D, bound).to(theta.dtype))
        first += k
    return torch.cat(outs)
