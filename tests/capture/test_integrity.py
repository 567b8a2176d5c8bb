"""The model moves only inside the private step (``capture.integrity``): correct training with
momentum, Adam, AdamW's weight decay, a learning-rate schedule and an EMA copy changes nothing
outside the step (and training is bit for bit the same with and without the check); a tensor
moved after ``optimizer.step()``, a parameter outside the DP optimizer moved, a buffer updated
from the data are each named with the step; a declared post-processing explains exactly what it
does and nothing else; the comparison is of bit patterns."""

from __future__ import annotations

import warnings

import pytest
import torch
from opacus import PrivacyEngine
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpaudit.capture import AuditHook, GradientCanaries
from dpaudit.capture.integrity import differs
from dpaudit.experiment.judging.doors import describe_door, integrity_check
from dpaudit.report.files import p_text

warnings.filterwarnings("ignore", module="opacus")
STEPS = 12


class Net(nn.Module):
    def __init__(self, frozen_head: bool = False, running: bool = False):
        super().__init__()
        self.body = nn.Linear(6, 8)
        self.head = nn.Linear(8, 3)
        if frozen_head:
            self.head.requires_grad_(False)
        self.running = running
        self.register_buffer("mean", torch.zeros(6))

    def forward(self, x):
        if self.running and self.training:  # running statistics of the private batch
            with torch.no_grad():
                self.mean.mul_(0.9).add_(x.mean(0), alpha=0.1)
        return self.head(torch.relu(self.body(x)))


def _run(optimizer="sgd", after_step=None, hook=True, post_step=None, net=None, schedule=False,
         ema=False, seed=0):
    torch.manual_seed(seed)
    model = net or Net()
    g = torch.Generator().manual_seed(seed)
    data = TensorDataset(torch.randn(300, 6, generator=g), torch.randint(0, 3, (300,), generator=g))
    params = [p for p in model.parameters() if p.requires_grad]
    base = {"sgd": lambda: torch.optim.SGD(params, lr=0.1, momentum=0.9),
            "adam": lambda: torch.optim.Adam(params, lr=0.01),
            "adamw": lambda: torch.optim.AdamW(params, lr=0.01, weight_decay=0.1)}[optimizer]()
    engine = PrivacyEngine()
    model, opt, loader = engine.make_private(
        module=model, optimizer=base, data_loader=DataLoader(data, batch_size=30),
        noise_multiplier=1.0, max_grad_norm=1.0,
        noise_generator=torch.Generator().manual_seed(seed + 1))
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5) if schedule else None
    averaged = torch.optim.swa_utils.AveragedModel(model._module) if ema else None
    dim = sum(p.numel() for p in params)
    can = GradientCanaries.dirac([0], norm=1.0, dim=dim, policy="never")
    h = AuditHook(opt, model, [can], post_step=post_step) if hook else None
    if h:
        h.attach()
    done = 0
    while done < STEPS:
        for xb, yb in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
            done += 1
            if after_step:
                after_step(model._module, done)
            if sched:
                sched.step()
            if averaged:
                averaged.update_parameters(model._module)
            if done >= STEPS:
                break
    if h:
        h.detach()
    state = torch.cat([t.detach().reshape(-1) for t in model._module.state_dict().values()])
    return h, state


def _check(hook):
    return integrity_check(hook.white_box_records())


@pytest.mark.parametrize(("optimizer", "schedule", "ema"),
                         [("sgd", False, False), ("adam", True, False), ("adamw", False, True)])
def test_correct_training_moves_only_inside_the_step(optimizer, schedule, ema):
    hook, state = _run(optimizer, schedule=schedule, ema=ema)
    check = _check(hook)
    assert not check.rejected and check.witness == {}
    rec = hook.white_box_records().integrity
    assert rec.steps == STEPS and rec.kinds.count("dp") == 4 and rec.kinds.count("buffer") == 1
    _, plain = _run(optimizer, hook=False, schedule=schedule, ema=ema)
    assert torch.equal(state, plain)  # watched, training is bit for bit the same


def _manual_head_step(model, t):
    with torch.no_grad():  # a manual update after optimizer.step(): 1% of a plain step
        model.head.bias.sub_(0.01 * model.head.bias.grad)


def test_a_tensor_moved_after_the_step_is_named_with_the_step():
    hook, _ = _run(after_step=lambda m, t: _manual_head_step(m, t) if t == 5 else None)
    check = _check(hook)
    assert check.rejected
    assert check.witness["tensor"] == "head.bias" and check.witness["when"] == "between steps"
    assert check.witness["step"] == 4 and check.witness["times"] == 1  # after private step 4
    line = describe_door(check, p_text)
    assert "head.bias" in line and "between private steps 4 and 5" in line


def test_a_second_optimizer_on_a_parameter_outside_the_dp_optimizer_is_named():
    net = Net(frozen_head=True)
    extra = torch.optim.SGD(net.head.parameters(), lr=0.1)

    def second(model, t):  # the head trained on its own, without privacy
        model.head.weight.requires_grad_(True)
        extra.zero_grad()
        model.head.weight.grad = torch.ones_like(model.head.weight)
        extra.step()

    hook, _ = _run(net=net, after_step=second)
    check = _check(hook)
    assert check.rejected and check.witness["tensor"] == "head.weight"
    assert check.witness["kind"] == "other"


def test_a_buffer_updated_from_the_batch_is_named():
    hook, _ = _run(net=Net(running=True))
    check = _check(hook)
    assert check.rejected and check.witness["tensor"] == "mean"
    assert check.witness["kind"] == "buffer" and check.witness["when"] == "between steps"


def _clamp(model, t):
    with torch.no_grad():
        model.body.weight.clamp_(-0.2, 0.2)


def test_a_declared_post_step_explains_exactly_what_it_does():
    declared = lambda t: {"body.weight": t["body.weight"].clamp(-0.2, 0.2)}  # noqa: E731
    hook, state = _run(after_step=_clamp, post_step=declared)
    check = _check(hook)
    assert not check.rejected
    rec = hook.white_box_records().integrity
    assert rec.post_step and rec.explained >= 1
    _, plain = _run(after_step=_clamp, hook=False)
    assert torch.equal(state, plain)
    # undeclared, the same clamp is a finding; declared at another bound, it is not explained
    undeclared, _ = _run(after_step=_clamp)
    assert _check(undeclared).rejected
    wrong = lambda t: {"body.weight": t["body.weight"].clamp(-0.3, 0.3)}  # noqa: E731
    mis, _ = _run(after_step=_clamp, post_step=wrong)
    check = _check(mis)
    assert check.rejected and check.witness["largest_change"] > 0


@pytest.mark.parametrize(("post_step", "match"), [
    (lambda t: 3, "must return a mapping"),
    (lambda t: {"nope": t["body.weight"]}, "the model does not have"),
    (lambda t: {"body.weight": t["body.weight"][0]}, "expected a tensor of shape"),
    (lambda t: 1 / 0, "post_step raised ZeroDivisionError"),
    ("clamp", "post_step must be a function"),
])
def test_a_mistaken_post_step_is_refused_before_training(post_step, match):
    with pytest.raises(ValueError, match=match):
        _run(post_step=post_step)


def test_the_comparison_is_of_bit_patterns():
    a = torch.tensor([0.0, 1.0, float("nan")])
    assert differs(a, torch.tensor([-0.0, 1.0, float("nan")]))  # -0.0 is another bit pattern
    assert not differs(a, a.clone())  # a NaN equals itself
    b16 = torch.tensor([1.0, 2.0], dtype=torch.bfloat16)  # no numpy dtype: torch's compare
    assert not bool(differs(b16, b16.clone()))
    assert bool(differs(b16, b16 + torch.tensor([0.0, 0.015625], dtype=torch.bfloat16)))  # 1 ulp
    ints = torch.arange(5)
    assert not differs(ints, ints.clone()) and differs(ints, ints.flip(0))
