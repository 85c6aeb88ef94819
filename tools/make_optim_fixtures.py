#!/usr/bin/python3
"""Writes tests/fixtures/optim_torch.json: parameter trajectories of torch.optim
optimizers on fixed gradients, the independent reference for athanor's
optimizers. Run with Debian's PyTorch:  /usr/bin/python3 tools/make_optim_fixtures.py
"""
import json
import os

import torch

torch.manual_seed(0)
P0 = [0.5, -1.25, 2.0, 0.0]
GRADS = [[0.1, -0.2, 0.3, 0.0], [0.5, 0.5, -0.5, 0.25], [-1.0, 0.01, 0.2, -0.3], [0.0, 2.0, -2.0, 1.0], [0.3, -0.1, 0.05, 0.7]]
CASES = {
    "sgd": (torch.optim.SGD, dict(lr=0.1)),
    "sgd_momentum_wd": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01)),
    "sgd_nesterov": (torch.optim.SGD, dict(lr=0.05, momentum=0.8, nesterov=True)),
    "rmsprop": (torch.optim.RMSprop, dict(lr=0.01, alpha=0.9, eps=1e-8)),
    "rmsprop_centered_momentum": (torch.optim.RMSprop, dict(lr=0.01, alpha=0.95, eps=1e-6, momentum=0.5, centered=True, weight_decay=0.1)),
    "adam": (torch.optim.Adam, dict(lr=0.01, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.05)),
    "adamw": (torch.optim.AdamW, dict(lr=0.01, betas=(0.8, 0.95), eps=1e-8, weight_decay=0.1)),
}

out = {"p0": P0, "grads": GRADS, "torch_version": torch.__version__, "cases": {}}
for name, (cls, kw) in CASES.items():
    p = torch.tensor(P0, dtype=torch.float64, requires_grad=True)
    opt = cls([p], **kw)
    traj = []
    for g in GRADS:
        p.grad = torch.tensor(g, dtype=torch.float64)
        opt.step()
        traj.append(p.detach().tolist())
    out["cases"][name] = {"options": {k: (list(v) if isinstance(v, tuple) else v) for k, v in kw.items()}, "trajectory": traj}

path = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "optim_torch.json")
with open(path, "w") as f:
    json.dump(out, f, indent=1, sort_keys=True)
print("wrote", os.path.normpath(path))
