"""One battery over every loss (cases come from ``cases_*.py``; contract in ``_cases.py``).

Per case and batch shape: the loss is finite, every ``loss_*`` term reaches exactly the
parameters its case names (and target parameters never get gradients), the output is
deterministic under a seed, a ``state_dict`` round trip reproduces it, a missing key is a
KeyError that says how to fix it, and forward+backward compiles with ``fullgraph=True``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from steersman.objectives import DQNLoss, HardUpdate, SoftUpdate, ValueEstimators, total_loss
from steersman.tensordict import TensorDictBase, TensorDictParams
from tests.objectives._cases import lazy_inputs

HERE = Path(__file__).resolve().parent


def _load_cases() -> list:
    sys.path.insert(0, str(HERE))  # cases modules import ``_cases`` as a sibling
    try:
        cases = []
        for path in sorted(HERE.glob("cases_*.py")):
            spec = importlib.util.spec_from_file_location(f"_battery_{path.stem}", path)
            mod = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = mod  # torch.compile looks functions' modules up by name
            spec.loader.exec_module(mod)
            cases.extend(mod.CASES)
        return cases
    finally:
        sys.path.remove(str(HERE))


CASES = _load_cases()
# compile once per loss class (its variants share the code path; compiling costs seconds each)
COMPILE_CASES = list({c.name.split("-")[0]: c for c in reversed(CASES)}.values())[::-1]
SHAPED = [(c, s) for c in CASES for s in c.batch_shapes]


def _is_term(key: str) -> bool:
    return key == "loss" or key.startswith("loss_")  # DQNLoss's single term is "loss" (TorchRL)


def _ids(x):
    case, shape = x if isinstance(x, tuple) else (x, None)
    return case.name if shape is None else f"{case.name}-{list(shape)}"


def _build(case, shape, seed=0):
    torch.manual_seed(seed)
    loss = case.make_loss()
    batch = case.make_batch(loss, shape)
    return loss, batch


def _forward(loss, batch, seed=1):
    torch.manual_seed(seed)
    return loss(batch.clone())


def test_cases_were_found():
    names = {c.name.split("-")[0] for c in CASES}
    assert len(CASES) >= 1, "no loss cases found in tests/objectives/cases_*.py"
    assert len(names) == len(CASES) or len(CASES) > len(names)


@pytest.mark.parametrize("case_shape", SHAPED, ids=[_ids(x) for x in SHAPED])
def test_finite_and_terms(case_shape):
    case, shape = case_shape
    loss, batch = _build(case, shape)
    out = _forward(loss, batch)
    terms = {k for k in out.keys() if _is_term(k)}
    assert terms == set(case.grad_map), f"loss terms {sorted(terms)} != grad_map {sorted(case.grad_map)}"
    for key in out.keys():
        value = out[key]
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            assert torch.isfinite(value).all(), f"{case.name}: {key} is not finite: {value}"
            if not _is_term(key):
                assert not value.requires_grad, f"{case.name}: diagnostic {key} is not detached"
    for term in terms:
        assert out[term].shape == torch.Size([]), f"{term} is not a scalar: {out[term].shape}"


@pytest.mark.parametrize("case_shape", SHAPED, ids=[_ids(x) for x in SHAPED])
def test_gradients_reach_exactly_the_intended_parameters(case_shape):
    case, shape = case_shape
    loss, batch = _build(case, shape)
    named = [(n, p) for n, p in loss.named_parameters() if p.requires_grad]
    assert named, "the loss has no trainable parameters"
    for n, p in loss.named_parameters():
        if "target_" in n:
            assert not p.requires_grad, f"target parameter {n} requires grad"
    for term, prefixes in case.grad_map.items():
        loss.zero_grad(set_to_none=True)
        out = _forward(loss, batch)
        out[term].backward()
        reached = {n for n, p in named if p.grad is not None and p.grad.abs().sum() > 0}
        expected_owner = {n for n in reached if any(n.startswith(pre) for pre in prefixes)}
        stray = reached - expected_owner
        assert not stray, f"{case.name}: {term} sends gradient to {sorted(stray)}"
        for pre in prefixes:
            assert any(n.startswith(pre) for n in reached), f"{case.name}: {term} reaches nothing under {pre!r}"
        for n, p in loss.named_parameters():
            if "target_" in n:
                assert p.grad is None, f"{case.name}: target parameter {n} got a gradient from {term}"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_deterministic_and_state_dict_round_trip(case):
    shape = case.batch_shapes[-1]
    loss, batch = _build(case, shape, seed=0)
    out1 = _forward(loss, batch)
    if case.deterministic:
        out2 = _forward(loss, batch)
        for key in out1.keys():
            torch.testing.assert_close(out1[key], out2[key], msg=f"{case.name}: {key} differs between two seeded calls")
    # a second loss built from another seed, loaded from the first's state_dict, gives the same output
    torch.manual_seed(123)
    other = case.make_loss()
    batch_other = case.make_batch(other, shape)  # materializes lazy modules, if any
    del batch_other
    other.load_state_dict(loss.state_dict())
    if case.deterministic:
        out3 = _forward(other, batch)
        for key in out1.keys():
            torch.testing.assert_close(out1[key], out3[key], msg=f"{case.name}: {key} differs after state_dict round trip")
    sd1, sd2 = loss.state_dict(), other.state_dict()
    assert sd1.keys() == sd2.keys()
    for k in sd1:
        assert torch.equal(sd1[k], sd2[k]), k


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_missing_key_error_names_the_fix(case):
    loss, batch = _build(case, case.batch_shapes[0])
    key = getattr(loss.tensor_keys, case.required_key)
    before = {k: v.clone() for k, v in loss.state_dict().items()}
    batch = batch.exclude(key)
    with pytest.raises(KeyError) as err:
        loss(batch)
    msg = str(err.value)
    assert type(loss).__name__ in msg and "set_keys" in msg and case.required_key in msg, msg
    for k, v in loss.state_dict().items():
        assert torch.equal(v, before[k]), f"{k} changed by a failed call"


@pytest.mark.parametrize("case", COMPILE_CASES, ids=[c.name for c in COMPILE_CASES])
def test_value_estimators_accepted_or_refused_by_name(case):
    """Every loss builds the estimators it lists; any other one is refused by name, and the
    estimator in place is kept."""
    loss = case.make_loss()
    supported = loss.supported_value_estimators or tuple(ValueEstimators)
    for value_type in supported:
        loss.make_value_estimator(value_type, gamma=0.9)
    kept = loss.value_estimator
    for value_type in set(ValueEstimators) - set(supported):
        with pytest.raises(NotImplementedError, match=f"{type(loss).__name__} has no {value_type.name}"):
            loss.make_value_estimator(value_type)
        assert loss.value_estimator is kept


#: the one case compiled with ``aot_eager``, which traces the backward graph too; the others
#: use ``backend="eager"``: dynamo still raises on any graph break under ``fullgraph=True``, at
#: a fraction of the cost (AOT tracing took 3-11 s per loss).
AOT_CASE = "SACLoss"
assert AOT_CASE in {c.name for c in COMPILE_CASES}, AOT_CASE


@pytest.mark.parametrize("case", COMPILE_CASES, ids=[c.name for c in COMPILE_CASES])
def test_compiles_fullgraph_forward_backward(case):
    torch._dynamo.reset()
    loss, batch = _build(case, case.batch_shapes[0])
    _forward(loss, batch)  # materialize lazy modules / estimators eagerly

    def step(td):
        return total_loss(loss(td))

    backend = "aot_eager" if case.name == AOT_CASE else "eager"
    compiled = torch.compile(step, fullgraph=True, backend=backend)
    torch.manual_seed(1)
    eager_value = step(batch.clone())
    eager_value.backward()
    eager_grads = {n: p.grad.clone() for n, p in loss.named_parameters() if p.grad is not None}
    loss.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    value = compiled(batch.clone())
    value.backward()
    assert torch.isfinite(value)
    if case.deterministic:
        torch.testing.assert_close(value, eager_value)
        for n, g in eager_grads.items():
            p = dict(loss.named_parameters())[n]
            torch.testing.assert_close(p.grad, g, msg=f"{case.name}: compiled grad of {n} differs")


# ------------------------------------------------------------ TorchRL's parameter attributes
#: the attributes TorchRL's loss of the same name exposes (checked against its sources)
TORCHRL_PARAM_ATTRS = {
    "DQNLoss": {"value_network_params", "target_value_network_params"},
    "DistributionalDQNLoss": {"value_network_params", "target_value_network_params"},
    "DDPGLoss": {"actor_network_params", "target_actor_network_params", "value_network_params",
                 "target_value_network_params"},
    "TD3Loss": {"actor_network_params", "target_actor_network_params", "qvalue_network_params",
                "target_qvalue_network_params"},
    "A2CLoss": {"actor_network_params", "critic_network_params", "target_actor_network_params",
                "target_critic_network_params"},
}
for _name in ("PPOLoss", "ClipPPOLoss", "KLPENPPOLoss"):
    TORCHRL_PARAM_ATTRS[_name] = TORCHRL_PARAM_ATTRS["A2CLoss"]
for _name in ("SACLoss", "DiscreteSACLoss", "IQLLoss", "CQLLoss", "REDQLoss"):
    TORCHRL_PARAM_ATTRS[_name] = {"actor_network_params", "qvalue_network_params", "target_qvalue_network_params"}
TORCHRL_PARAM_ATTRS["IQLLoss"] = TORCHRL_PARAM_ATTRS["IQLLoss"] | {"value_network_params"}
for _name in ("MAPPOLoss", "IPPOLoss"):
    TORCHRL_PARAM_ATTRS[_name] = TORCHRL_PARAM_ATTRS["A2CLoss"]
TORCHRL_PARAM_ATTRS["ReinforceLoss"] = TORCHRL_PARAM_ATTRS["A2CLoss"]
TORCHRL_PARAM_ATTRS["BCLoss"] = {"actor_network_params"}
TORCHRL_PARAM_ATTRS["TD3BCLoss"] = TORCHRL_PARAM_ATTRS["TD3Loss"]
TORCHRL_PARAM_ATTRS["DiscreteCQLLoss"] = TORCHRL_PARAM_ATTRS["DQNLoss"]
TORCHRL_PARAM_ATTRS["GAILLoss"] = {"discriminator_network_params"}
TORCHRL_PARAM_ATTRS["RNDLoss"] = {"predictor_network_params"}
TORCHRL_PARAM_ATTRS["CrossQLoss"] = TORCHRL_PARAM_ATTRS["SACLoss"]
TORCHRL_PARAM_ATTRS["DiscreteIQLLoss"] = TORCHRL_PARAM_ATTRS["IQLLoss"]
TORCHRL_PARAM_ATTRS["TQCLoss"] = TORCHRL_PARAM_ATTRS["SACLoss"]
TORCHRL_PARAM_ATTRS["DTLoss"] = TORCHRL_PARAM_ATTRS["OnlineDTLoss"] = {"actor_network_params", "target_actor_network_params"}
TORCHRL_PARAM_ATTRS["WorldModelLoss"] = {"world_model_params"}
TORCHRL_PARAM_ATTRS["QMixerLoss"] = {"local_value_network_params", "target_local_value_network_params",
                                     "mixer_network_params", "target_mixer_network_params"}


def _param_attrs(loss) -> list[tuple[str, object]]:
    """``(name, TensorDict)`` for every ``*_params`` attribute the loss has."""
    out = []
    for name in sorted(dir(type(loss))):
        if name.endswith("_params") and isinstance(getattr(type(loss), name), property):
            try:
                out.append((name, getattr(loss, name)))
            except AttributeError:  # e.g. SAC v2 has no value_network
                continue
    return out


def _leaves(td) -> list[torch.Tensor]:
    return [td.get(k) for k in sorted(td.keys(include_nested=True, leaves_only=True), key=str)]


def _shift_(td, amount: float) -> None:
    with torch.no_grad():
        for t in _leaves(td):
            if t.is_floating_point():
                t.add_(amount)


def _outputs_differ(a, b) -> bool:
    return any(not torch.equal(a[k], b[k]) for k in a.keys() if a[k].is_floating_point())


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_parameter_attributes_are_the_networks_tensors(case):
    loss, batch = _build(case, case.batch_shapes[0])
    _forward(loss, batch)
    attrs = dict(_param_attrs(loss))
    missing = TORCHRL_PARAM_ATTRS[type(loss).__name__] - set(attrs)
    assert not missing, f"{case.name}: TorchRL's {sorted(missing)} are missing"
    owned = {t.data_ptr() for t in [*loss.parameters(), *loss.buffers()]}
    for name, params in attrs.items():
        assert isinstance(params, TensorDictBase), f"{name} is a {type(params).__name__}"
        leaves = _leaves(params)
        assert leaves and all(t.data_ptr() in owned for t in leaves), f"{name}: leaves are not the loss's tensors"
        if not name.startswith("target_"):
            assert isinstance(params, TensorDictParams), f"{name} is not a TensorDictParams"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_in_place_update_through_attributes_reaches_the_loss(case):
    loss, batch = _build(case, case.batch_shapes[0])
    before = _forward(loss, batch)
    for name, params in _param_attrs(loss):
        online_name = name.removeprefix("target_")
        shares_online = name != online_name and _leaves(params)[0].data_ptr() == _leaves(getattr(loss, online_name))[0].data_ptr()
        if shares_online:  # no target network here: the attribute is the online tensors, detached
            continue
        _shift_(params, 0.25)
        after = _forward(loss, batch)
        assert _outputs_differ(before, after), f"{case.name}: updating {name} in place changed nothing"
        _shift_(params, -0.25)
        before = _forward(loss, batch)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_target_updaters_act_on_the_target_attributes(case):
    loss, batch = _build(case, case.batch_shapes[0])
    _forward(loss, batch)
    targets = [(n, p) for n, p in _param_attrs(loss) if n.startswith("target_")
               and _leaves(p)[0].data_ptr() != _leaves(getattr(loss, n.removeprefix("target_")))[0].data_ptr()]
    if not loss.target_names:
        assert not targets
        with pytest.raises(ValueError, match="no target networks"):
            SoftUpdate(loss, tau=0.5)
        return
    assert targets, f"{case.name} has target networks but no target_* attribute shows them"
    for _, target in targets:
        _shift_(target, 1.0)
    HardUpdate(loss, value_network_update_interval=1).step()
    for name, target in targets:
        online = getattr(loss, name.removeprefix("target_"))
        for t, o in zip(_leaves(target), _leaves(online)):
            torch.testing.assert_close(t, o, msg=f"{case.name}: HardUpdate left {name} behind")
        _shift_(target, 1.0)
    SoftUpdate(loss, tau=0.5).step()
    for name, target in targets:
        online = getattr(loss, name.removeprefix("target_"))
        for t, o in zip(_leaves(target), _leaves(online)):
            if t.is_floating_point():
                torch.testing.assert_close(t, o + 0.5, msg=f"{case.name}: SoftUpdate did not move {name}")


# ------------------------------------------------------------ lazy (uninitialized) networks
def _lazy_tensors(loss) -> list[torch.Tensor]:
    template = loss.__dict__.get("qvalue_network")  # an ensemble's template, outside the parameters
    tensors = [*loss.parameters(), *loss.buffers(), *(template.parameters() if template is not None else [])]
    return [t for t in tensors if torch.nn.parameter.is_lazy(t)]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_lazy_networks_are_set_up_on_the_first_call(case):
    shape = case.batch_shapes[0]
    torch.manual_seed(0)
    with lazy_inputs():
        loss = case.make_loss()  # touches no uninitialized parameter
    assert _lazy_tensors(loss), f"{case.name}: built with lazy input layers, but nothing is lazy"
    updater = SoftUpdate(loss, tau=0.5) if loss.target_names else None  # built before the first call, as in TorchRL
    batch = case.make_batch(loss, shape)
    out = _forward(loss, batch)  # first call: lazy layers run, targets and ensembles appear
    assert not _lazy_tensors(loss), f"{case.name}: lazy tensors left after the first call"
    assert {k for k in out.keys() if _is_term(k)} == set(case.grad_map)
    for name, params in _param_attrs(loss):
        if name.startswith("target_"):  # every target starts equal to its online network
            online = getattr(loss, name.removeprefix("target_"))
            for t, o in zip(_leaves(params), _leaves(online)):
                assert torch.equal(t, o), f"{case.name}: {name} does not start equal to the online network"
    # an optimizer built after the first call sees every trainable parameter and trains them
    params = [p for p in loss.parameters() if p.requires_grad]
    optim = torch.optim.SGD(params, lr=0.1)
    before = {n: p.detach().clone() for n, p in loss.named_parameters()}
    total_loss(_forward(loss, batch)).backward()
    optim.step()
    for prefixes in case.grad_map.values():
        for pre in prefixes:
            changed = [n for n, p in loss.named_parameters() if n.startswith(pre) and not torch.equal(p, before[n])]
            assert changed, f"{case.name}: no parameter under {pre!r} was trained"
    if updater is not None:  # the updater made before the targets existed moves them now
        old = [t.clone() for _, target in loss.target_pairs() for t in _leaves(target)]
        updater.step()
        new = [t for _, target in loss.target_pairs() for t in _leaves(target)]
        assert old and any(not torch.equal(a, b) for a, b in zip(old, new)), f"{case.name}: SoftUpdate moved no target"


def test_lazy_target_attribute_before_the_first_call_says_when_it_exists():
    from tests.objectives.cases_value_based import discrete_batch, q_network

    torch.manual_seed(0)
    with lazy_inputs():
        loss = DQNLoss(q_network(), action_space="categorical")
    with pytest.raises(RuntimeError, match="first call"):
        _ = loss.target_value_network_params
    loss(discrete_batch(loss, (4,)))
    target, online = loss.target_value_network_params, loss.value_network_params
    assert target["module", "0", "weight"].shape == (8, 4)
    assert torch.equal(target["module", "0", "weight"], online["module", "0", "weight"])


def test_lazy_first_call_on_a_bad_batch_is_retried():
    """A first call the lazy networks cannot read raises and sets nothing up; the next good
    call does."""
    from tests.objectives.cases_value_based import discrete_batch, q_network

    torch.manual_seed(0)
    with lazy_inputs():
        loss = DQNLoss(q_network(), action_space="categorical")
    batch = discrete_batch(loss, (4,))
    with pytest.raises(KeyError, match="observation"):
        loss(batch.exclude("observation"))
    assert not hasattr(loss, "target_value_network")
    out = loss(batch)
    assert torch.isfinite(out["loss"])
    assert torch.equal(loss.target_value_network_params["module", "0", "weight"],
                       loss.value_network_params["module", "0", "weight"])


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_lazy_loss_loads_a_state_dict_before_its_first_call(case):
    """Resuming with lazy networks: a fresh lazy loss takes a used one's state dict (lazy
    tensors take the stored shapes, targets and stacks are made) and computes the same loss."""
    shape = case.batch_shapes[0]
    torch.manual_seed(0)
    with lazy_inputs():
        used = case.make_loss()
    batch = case.make_batch(used, shape)
    _forward(used, batch)  # the first call sets the lazy layers up (their init draws random numbers)
    expected = _forward(used, batch)
    torch.manual_seed(1)
    with lazy_inputs():
        fresh = case.make_loss()
    assert _lazy_tensors(fresh)
    fresh.load_state_dict(used.state_dict())  # strict: every entry has a place
    assert not _lazy_tensors(fresh), f"{case.name}: lazy tensors left after loading"
    assert fresh.state_dict().keys() == used.state_dict().keys()
    got = _forward(fresh, batch)
    if case.deterministic:
        for key in expected.keys():
            torch.testing.assert_close(got[key], expected[key], msg=f"{case.name}: {key} differs after loading")
