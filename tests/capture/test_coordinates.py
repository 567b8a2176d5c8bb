"""Own-loop coordinate helpers: (name, index) <-> flat coordinate, the dimension and numbering
of the hook's ``params`` selection, and the coordinates no data touch, of both kinds: at
theta_0 checked against a one-example-at-a-time autograd reference, structural against the
closed form of the blanked inputs, on the own-loop model families; an audit from them leaves
training bit for bit unchanged off the canaries."""

import numpy as np
import pytest
import torch
from opacus import PrivacyEngine
from own_loop_models import BATCH, FAMILIES, FAMILIES_MODELS, VOCAB, data
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpaudit.capture import (
    AuditHook,
    GradientCanaries,
    InputCanaries,
    dead_coordinates,
    flat_coordinate,
    parameter_at,
    trainable_dim,
)

N_EXAMPLES = 96
UNUSED_TOKENS = 6  # token ids VOCAB-6 .. VOCAB-1 never occur: their embedding rows are dead


def blanked(family: str) -> TensorDataset:
    """The family's synthetic data with structural zeros: the first 8 features, the first
    input channel, or the last token ids never used."""
    x, y = data(FAMILIES[family].inputs, seed=0).tensors
    x, y = x[:N_EXAMPLES].clone(), y[:N_EXAMPLES]
    if FAMILIES[family].inputs == "tokens":
        x = x % (VOCAB - UNUSED_TOKENS)
    elif FAMILIES[family].inputs == "features":
        x[:, :8] = 0
    else:
        x[:, 0] = 0
    return TensorDataset(x, y)


def reference_dead(model: nn.Module, ds: TensorDataset) -> np.ndarray:
    """Coordinates whose gradient is exactly zero for every example, one example at a time."""
    params = [p for p in model.parameters() if p.requires_grad]
    total = torch.zeros(sum(p.numel() for p in params), dtype=torch.float64)
    x, y = ds.tensors
    for i in range(len(x)):
        loss = nn.functional.cross_entropy(model(x[i:i + 1]), y[i:i + 1])
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        flat = torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1)
                          for g, p in zip(grads, params, strict=True)])
        total += flat.abs().double()
    return np.flatnonzero(total.numpy() == 0)


def test_flat_coordinate_and_back_skip_frozen_parameters_and_opacus_prefix():
    model = FAMILIES_MODELS["frozen_first_layer"]()  # 0.* frozen; 2.weight (32, 48) first
    assert trainable_dim(model) == 32 * 48 + 32 + 4 * 32 + 4
    assert flat_coordinate(model, "2.weight", (1, 2)) == 48 + 2
    assert flat_coordinate(model, "2.bias", 0) == 32 * 48
    assert flat_coordinate(model, "4.weight", -1) == 32 * 48 + 32 + 4 * 32 - 1
    for c in (0, 50, 32 * 48, trainable_dim(model) - 1):
        name, idx = parameter_at(model, c)
        assert flat_coordinate(model, name, idx) == c
    assert parameter_at(model, 32 * 48 + 32 + 5) == ("4.weight", (0, 5))
    from opacus import GradSampleModule

    wrapped = GradSampleModule(FAMILIES_MODELS["frozen_first_layer"]())
    assert flat_coordinate(wrapped, "_module.2.weight", (1, 2)) == 50
    assert flat_coordinate(wrapped, "2.weight", (1, 2)) == 50
    with pytest.raises(ValueError, match=r"no trainable parameter '0.weight' \(it is frozen"):
        flat_coordinate(model, "0.weight", 0)
    with pytest.raises(ValueError, match=r"index \(32, 0\) does not fit 2.weight"):
        flat_coordinate(model, "2.weight", (32, 0))
    with pytest.raises(ValueError, match=r"coordinate must be an integer in \[0, "):
        parameter_at(model, trainable_dim(model))


def test_out_of_range_dirac_coordinates_quote_a_few_and_count_the_rest():
    with pytest.raises(ValueError) as err:
        GradientCanaries.dirac(list(range(6000, 6400)), norm=1.0, dim=2212)
    msg = str(err.value)
    assert "400 of 400 do not: [6000, 6001, 6002, 6003, 6004, ... and 395 more]" in msg
    assert "6399" not in msg and len(msg) < 300


def blank_coordinates(family: str, model: nn.Module) -> list[int]:
    """The closed form of the structurally dead coordinates of ``blanked(family)``: the unused
    ids' embedding rows, or the first layer's weights on the blank inputs (every kernel offset
    of a blank channel), or none when the first layer is frozen."""
    inputs = FAMILIES[family].inputs
    if family == "frozen_first_layer":
        return []
    name, w = next((n, p) for n, p in model.named_parameters() if p.dim() >= 2)
    if inputs == "tokens":
        return sorted(flat_coordinate(model, name, (t, j))
                      for t in range(VOCAB - UNUSED_TOKENS, VOCAB) for j in range(w.shape[1]))
    blank = range(8) if inputs == "features" else [0]
    return sorted(flat_coordinate(model, name, (o, i, *k)) for o in range(w.shape[0])
                  for i in blank for k in np.ndindex(*w.shape[2:]))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_dead_coordinates_of_both_kinds_equal_their_references(family):
    torch.manual_seed(0)
    model = FAMILIES_MODELS[family]()
    ds = blanked(family)
    at_theta0 = dead_coordinates(model, DataLoader(ds, batch_size=32), batch_size=40,
                                 kind="at_theta0")
    np.testing.assert_array_equal(at_theta0, reference_dead(model, ds))
    structural = dead_coordinates(model, DataLoader(ds, batch_size=32), batch_size=40)
    assert structural.tolist() == blank_coordinates(family, model)
    assert set(structural.tolist()) <= set(at_theta0.tolist()) and len(at_theta0) > 0


def _train(family: str, ds: TensorDataset, canaries: GradientCanaries | None, steps: int = 12):
    torch.manual_seed(0)
    model = FAMILIES_MODELS[family]()
    loader = DataLoader(ds, batch_size=BATCH, generator=torch.Generator().manual_seed(0))
    engine = PrivacyEngine()
    model, opt, loader = engine.make_private(
        module=model, optimizer=torch.optim.SGD(
            [p for p in model.parameters() if p.requires_grad], lr=0.05),
        data_loader=loader, noise_multiplier=1.0, max_grad_norm=1.0,
        grad_sample_mode=FAMILIES[family].grad_sample_mode,
        noise_generator=torch.Generator().manual_seed(1))
    x, y = ds.tensors  # 8 input canaries beside them, folded where exact (input_pass="auto")
    sets = [canaries, InputCanaries(x[:8].clone(), y[:8].clone())]
    hook = AuditHook(opt, model, sets, input_pass="auto") if canaries is not None else None
    done = 0
    with hook if hook is not None else torch.enable_grad():
        while done < steps:
            for x, y in loader:
                opt.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                done += 1
                if done >= steps:
                    break
    return torch.cat([p.detach().reshape(-1) for p in model.parameters() if p.requires_grad])


@pytest.mark.parametrize("family", sorted(f for f in FAMILIES if f != "batch_memory_manager"))
def test_an_audit_on_the_dead_coordinates_leaves_training_unchanged_off_them(family):
    """The README's recipe without hand arithmetic: Dirac canaries on dead_coordinates, and
    input canaries under the default input_pass="auto" (attention included); the parameters
    off the "in" Dirac canaries' coordinates equal training without the hook bit for bit, and
    those move (the canary's own signal)."""
    torch.manual_seed(0)
    ds = blanked(family)
    kind = "at_theta0" if family == "frozen_first_layer" else "structural"  # it has none
    dead = dead_coordinates(FAMILIES_MODELS[family](), ds, kind=kind)[:16]
    member = np.arange(len(dead)) % 2 == 0
    dim = trainable_dim(FAMILIES_MODELS[family]())
    canaries = GradientCanaries.dirac(dead.tolist(), norm=1.0, dim=dim,
                                      policy=["every_step" if m else "never" for m in member])
    plain, audited = _train(family, ds, None), _train(family, ds, canaries)
    off = np.ones(dim, dtype=bool)
    off[dead[member]] = False
    assert torch.equal(plain[torch.from_numpy(off)], audited[torch.from_numpy(off)])
    assert bool((plain[dead[member]] != audited[dead[member]]).all())


def test_params_selection_is_numbered_as_the_hook_numbers_it():
    """trainable_dim, flat_coordinate, parameter_at and dead_coordinates take the hook's
    params (module or parameter names) and number coordinates inside that selection."""
    torch.manual_seed(0)
    ds = blanked("linear")  # features 0-7 blank; model: 0 Linear(64, 48), 2 Linear(48, 4)
    model = FAMILIES_MODELS["linear"]()
    engine = PrivacyEngine()
    private, opt, _ = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(ds, batch_size=BATCH), noise_multiplier=1.0, max_grad_norm=1.0)
    for params, dim in ((None, 64 * 48 + 48 + 48 * 4 + 4), ("2", 48 * 4 + 4),
                        (["0.weight"], 64 * 48), (["_module.2.bias", "0"], 64 * 48 + 48 + 4)):
        hook = AuditHook(opt, private, GradientCanaries.dirac([0], 1.0, dim), params=params)
        assert trainable_dim(private, params=params) == hook.full_dim == dim
    assert flat_coordinate(private, "2.bias", 1, params=["0", "2.bias"]) == 64 * 48 + 48 + 1
    assert parameter_at(private, 64 * 48 + 48 + 1, params=["0", "2.bias"]) == ("2.bias", (1,))
    with pytest.raises(ValueError, match=r"no trainable parameter '2.weight' in the selection"):
        flat_coordinate(private, "2.weight", 0, params=["0"])
    # the blank features' weights, numbered in the whole model and in the selection "0.weight"
    whole = dead_coordinates(private, ds)
    assert whole.tolist() == [o * 64 + i for o in range(48) for i in range(8)]
    np.testing.assert_array_equal(dead_coordinates(private, ds, params="0.weight"), whole)
    assert dead_coordinates(private, ds, params="2").size == 0
    head = dead_coordinates(private, ds, params=["2"], kind="at_theta0")
    full = dead_coordinates(private, ds, kind="at_theta0")
    np.testing.assert_array_equal(head + 64 * 48 + 48, full[full >= 64 * 48 + 48])
    with pytest.raises(ValueError, match=r"not parameter or module names .*did you mean "
                       r"'0.weight'"):
        dead_coordinates(private, ds, params=["0.wieght"])
    with pytest.raises(ValueError, match=r"kind must be one of \('structural', 'at_theta0'\), "
                       r"got 'at_init'"):
        dead_coordinates(private, ds, kind="at_init")


def test_an_opacus_wrapped_model_gives_the_same_and_its_hooks_see_nothing():
    from opacus import GradSampleModule

    torch.manual_seed(0)
    ds = blanked("conv2d_groupnorm")
    wrapped = GradSampleModule(FAMILIES_MODELS["conv2d_groupnorm"]())
    found = dead_coordinates(wrapped, ds)
    assert found.tolist() == blank_coordinates("conv2d_groupnorm", wrapped._module)
    assert all(not getattr(m, "activations", None) for m in wrapped.modules())


def test_random_augmentations_are_refused_for_the_structural_kind():
    class Jitter(torch.utils.data.Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            return torch.rand(4), 0

    with pytest.raises(ValueError, match="different inputs on two reads"):
        dead_coordinates(nn.Linear(4, 2), Jitter())


def test_no_dead_coordinates_says_what_to_do_next():
    """A tanh MLP on dense random data: no structural zero; Dirac canaries on the empty list
    name why and the three ways on (input canaries, live coordinates, the theta_0 kind)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 16), nn.Tanh(), nn.Linear(16, 3))
    x, y = torch.randn(64, 10), torch.randint(0, 3, (64,))
    coords = dead_coordinates(model, (x, y))
    assert coords.size == 0
    assert dead_coordinates(model, (x, y), kind="at_theta0").size == 0  # tanh: nothing dies
    with pytest.raises(ValueError) as err:
        GradientCanaries.dirac(coords.tolist(), norm=1.0, dim=trainable_dim(model))
    msg = str(err.value)
    for what in ("coords is empty", "InputCanaries", "independent_canaries=False",
                 "kind='at_theta0'", "docs/python_api.md"):
        assert what in msg, what
