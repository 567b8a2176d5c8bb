"""Structurally dead coordinates (``capture.structural`` through ``dead_coordinates``):
against closed forms and a brute-force reference on convolutions (a zero border, stride,
padding and its modes, dilation, groups), conservative where nothing is proven (a layer after
a computation, a tied or functionally reused weight, an overridden forward, an input modified
in place), and the difference from the theta_0 kind: a ReLU MLP whose units dead at theta_0
come alive after a few SGD steps, while the structural coordinates stay dead."""

import itertools

import numpy as np
import pytest
import torch
from torch import nn

from dpaudit.capture import dead_coordinates, flat_coordinate


def _union(x: torch.Tensor) -> np.ndarray:
    return (x != 0).any(0).numpy()


def brute_force_conv2d(x: torch.Tensor, conv: nn.Conv2d) -> np.ndarray:
    """Weight entries (flat, in the weight's order) that no non-zero input ever meets, by
    enumerating every output position of a zero-padded convolution (no torch conv)."""
    a = _union(x)  # (C, H, W): where some example is non-zero
    cin, h, w = a.shape
    (kh, kw), (sh, sw) = conv.kernel_size, conv.stride
    (ph, pw), (dh, dw) = conv.padding, conv.dilation
    out_h = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    out_w = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    per_group_in, per_group_out = cin // conv.groups, conv.out_channels // conv.groups
    dead = []
    for o, c, ki, kj in itertools.product(range(conv.out_channels), range(per_group_in),
                                          range(kh), range(kw)):
        channel = (o // per_group_out) * per_group_in + c
        hit = False
        for i, j in itertools.product(range(out_h), range(out_w)):
            r, s = i * sh - ph + ki * dh, j * sw - pw + kj * dw
            if 0 <= r < h and 0 <= s < w and a[channel, r, s]:
                hit = True
                break
        if not hit:
            dead.append(np.ravel_multi_index((o, c, ki, kj), tuple(conv.weight.shape)))
    return np.array(sorted(dead), dtype=np.int64)


def test_conv_with_a_zero_border_closed_form_and_it_stays_dead_through_training():
    """8 x 8 images non-zero only in the centre 2 x 2 (rows and columns 3, 4); a 3 x 3
    convolution of stride 3 visits rows {0, 1, 2} and {3, 4, 5}: offsets 0 and 1 meet the
    centre, offset 2 (rows 2 and 5) never does. Dead: the entries with ki = 2 or kj = 2, 5 of
    9 per output channel."""
    torch.manual_seed(0)
    x = torch.zeros(40, 1, 8, 8)
    x[:, :, 3:5, 3:5] = torch.rand(40, 1, 2, 2) + 0.1
    y = torch.randint(0, 3, (40,))
    model = nn.Sequential(nn.Conv2d(1, 2, 3, stride=3), nn.ReLU(), nn.Flatten(),
                          nn.Linear(2 * 2 * 2, 3))
    expected = [o * 9 + ki * 3 + kj for o in range(2) for ki in range(3) for kj in range(3)
                if ki == 2 or kj == 2]
    found = dead_coordinates(model, (x, y))
    assert found.tolist() == expected
    np.testing.assert_array_equal(found, brute_force_conv2d(x, model[0]))
    assert set(found) <= set(dead_coordinates(model, (x, y), kind="at_theta0"))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for _ in range(5):  # whatever the parameters become, no gradient reaches them
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        grad = model[0].weight.grad.reshape(-1)
        assert bool((grad[found] == 0).all()) and bool((grad != 0).sum() > 0)
        opt.step()
    assert set(found) <= set(dead_coordinates(model, (x, y), kind="at_theta0"))


@pytest.mark.parametrize(("stride", "padding", "dilation", "groups"), [
    (1, 0, 1, 1), (4, 1, 1, 1), (3, 2, 1, 1), (1, 1, 2, 1), (2, 0, 1, 2), (3, 1, 2, 2)])
def test_conv2d_equals_the_brute_force_reference(stride, padding, dilation, groups):
    gen = torch.Generator().manual_seed(stride * 100 + padding * 10 + dilation + groups)
    x = torch.randn(12, 2, 9, 9, generator=gen)
    near_edge = torch.zeros(1, 2, 9, 9, dtype=torch.bool)  # the top two rows, left columns
    near_edge[..., :2, :] = near_edge[..., :, :2] = True
    x = x * (near_edge & (torch.rand(1, 2, 9, 9, generator=gen) < 0.4))
    conv = nn.Conv2d(2, 4, 3, stride=stride, padding=padding, dilation=dilation, groups=groups)
    model = nn.Sequential(conv, nn.Flatten())
    found = dead_coordinates(model, (x, torch.zeros(12)), params=["0.weight"])
    np.testing.assert_array_equal(found, brute_force_conv2d(x, conv))
    assert 0 < len(found) < conv.weight.numel()  # the case has both kinds of entry


@pytest.mark.parametrize(("mode", "dead"), [("zeros", [0, 1]), ("reflect", [1])])
def test_padding_modes_other_than_zeros_copy_the_input(mode, dead):
    """Length 6, non-zero only at positions 1 and 4; kernel 3, stride 3, padding 1: output 0
    reads padded positions 0, 1, 2 = (pad, x0, x1), output 1 reads (x2, x3, x4). Offset 2 meets
    x1 and x4; offset 1 meets x0 and x3 (zero); offset 0 meets the pad and x2, and the
    reflected pad is x1, non-zero: dead {0, 1} with zero padding, {1} with reflection."""
    x = torch.zeros(5, 1, 6)
    x[:, 0, 1], x[:, 0, 4] = 1.0, 2.0
    conv = nn.Conv1d(1, 1, 3, stride=3, padding=1, padding_mode=mode, bias=False)
    found = dead_coordinates(nn.Sequential(conv, nn.Flatten()), (x, torch.zeros(5)))
    assert found.tolist() == dead


def test_a_conv_input_zero_in_one_example_only_is_alive():
    """Offset (0, 0) of a 2 x 2 stride-2 kernel visits the even rows and columns."""
    x = torch.randn(6, 1, 4, 4)
    x[:, :, ::2, ::2] = 0.0
    x[5, 0, 2, 2] = 1.0  # one example, one position
    conv = nn.Conv2d(1, 1, 2, stride=2, bias=False)
    assert dead_coordinates(nn.Sequential(conv, nn.Flatten()), (x, torch.zeros(6))).size == 0
    x[5, 0, 2, 2] = 0.0
    assert dead_coordinates(nn.Sequential(conv, nn.Flatten()),
                            (x, torch.zeros(6))).tolist() == [0]


class Scaled(nn.Module):
    def __init__(self, fc):
        super().__init__()
        self.fc = fc

    def forward(self, x):
        return self.fc(x / 255)  # a computation before the layer: nothing is proven


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x):
        h = torch.relu(self.fc(x))
        return h @ self.fc.weight.t()  # the weight again, on a hidden input


class InPlace(nn.Module):
    def __init__(self):
        super().__init__()
        self.shift = nn.Parameter(torch.zeros(6))
        self.fc = nn.Linear(6, 3)

    def forward(self, x):
        # the input shifted in place before the layer reads it: 0 at theta_0, so feature 2 is
        # still zero there, but training moves the shift and the feature with it
        x.add_(self.shift)
        return self.fc(x)


class MyLinear(nn.Linear):
    def forward(self, x):  # an overridden forward: not PyTorch's product with the input
        return super().forward(x.roll(1, dims=-1))


@pytest.mark.parametrize("build", [
    lambda: Scaled(nn.Linear(6, 3)),
    lambda: nn.Sequential(nn.Dropout(0.5), nn.Linear(6, 3)),
    lambda: nn.Sequential(nn.LayerNorm(6), nn.Linear(6, 3)),
    Tied,
    InPlace,
    lambda: MyLinear(6, 3),
], ids=["computed", "dropout", "norm", "tied", "in_place", "overridden"])
def test_nothing_is_called_structurally_dead_without_a_proof(build):
    torch.manual_seed(0)
    x = torch.rand(16, 6) + 0.5
    x[:, 2] = 0.0
    model = build()
    state = torch.random.get_rng_state()
    assert dead_coordinates(model, (x.clone(), torch.zeros(16))).size == 0
    assert torch.equal(torch.random.get_rng_state(), state)  # dropout's draws were undone
    plain = nn.Sequential(nn.Flatten(), nn.Linear(6, 3))  # the same data, read directly
    assert dead_coordinates(plain, (x, torch.zeros(16))).tolist() == [2, 8, 14]


def test_embedding_rows_of_unused_ids_and_a_tied_head():
    ids = torch.randint(0, 5, (20, 4))  # ids 5..7 of 8 never occur
    emb = nn.Sequential(nn.Embedding(8, 3), nn.Flatten(), nn.Linear(12, 2))
    assert dead_coordinates(emb, (ids, torch.zeros(20))).tolist() == list(range(15, 24))

    class TiedHead(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(8, 3)

        def forward(self, t):
            return self.emb(t).mean(1) @ self.emb.weight.t()  # the rows again, as a head

    assert dead_coordinates(TiedHead(), (ids, torch.zeros(20))).size == 0


def test_units_dead_at_theta0_come_alive_and_the_structural_ones_do_not():
    """x > 0 except feature 4 (zero in every example); h = relu(W1 x), W1 = 0.5: each unit
    in [1, 2]; the second layer's unit 1 has bias -8.5 below the largest sum of h (8): dead at
    theta_0, so its 4 weights, its bias and its head weight (coordinates 28-31, 33, 35) get
    no gradient. The loss pulls the output up, W1 grows, and within a few SGD steps unit 1
    fires: those 6 come alive. The 4 weights of feature 4 (coordinates 4, 9, 14, 19) never."""
    torch.manual_seed(0)
    n = 32
    x = torch.rand(n, 5) * 0.5 + 0.5
    x[:, 4] = 0.0
    y = torch.full((n, 1), 20.0)
    model = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 2), nn.ReLU(),
                          nn.Linear(2, 1))
    with torch.no_grad():
        model[0].weight.fill_(0.5)
        model[0].bias.zero_()
        model[2].weight.fill_(1.0)
        model[2].bias.copy_(torch.tensor([0.0, -8.5]))
        model[4].weight.fill_(1.0)
        model[4].bias.zero_()

    def loss(out, t):
        return ((out - t) ** 2).sum()

    structural = dead_coordinates(model, (x, y), loss_fn=loss)
    at_theta0 = dead_coordinates(model, (x, y), loss_fn=loss, kind="at_theta0")
    first = [flat_coordinate(model, "0.weight", (o, 4)) for o in range(4)]
    revived = [flat_coordinate(model, "2.weight", (1, i)) for i in range(4)] + [
        flat_coordinate(model, "2.bias", 1), flat_coordinate(model, "4.weight", (0, 1))]
    assert structural.tolist() == first == [4, 9, 14, 19]
    assert at_theta0.tolist() == sorted(first + revived)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for _ in range(4):
        opt.zero_grad()
        (loss(model(x), y) / n).backward()
        opt.step()
    after = dead_coordinates(model, (x, y), loss_fn=loss, kind="at_theta0")
    assert after.tolist() == first  # the theta_0 kind's extra ones came alive
    assert dead_coordinates(model, (x, y), loss_fn=loss).tolist() == first
