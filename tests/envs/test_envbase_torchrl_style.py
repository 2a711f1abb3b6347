"""Custom envs written the TorchRL way: the conveniences TorchRL's ``EnvBase`` gives
subclass authors (default done entries, ``_set_seed`` returning a seed, specs from shapes,
stateless envs, ``batch_locked = False``), with the stateless pendulum of TorchRL's
tutorial written as its users write it."""

from __future__ import annotations

import pytest
import torch

from steersman.data import Bounded, Categorical, Composite, Unbounded
from steersman.envs import (
    ActionMask,
    CartPoleEnv,
    CatTensors,
    EnvBase,
    PendulumEnv,
    TicTacToeEnv,
    Transform,
    TransformedEnv,
    UnsqueezeTransform,
    check_env_specs,
)
from steersman.envs.transforms import _apply_to_composite
from steersman.envs.utils import make_composite_from_td, terminated_or_truncated
from steersman.tensordict import TensorDict, TensorDictBase

# ---------------------------------------------------------------- the tutorial's pendulum
DEFAULT_X = torch.pi
DEFAULT_Y = 1.0


def angle_normalize(x):
    return ((x + torch.pi) % (2 * torch.pi)) - torch.pi


def _step(tensordict):
    th, thdot = tensordict["th"], tensordict["thdot"]
    g_force = tensordict["params", "g"]
    mass = tensordict["params", "m"]
    length = tensordict["params", "l"]
    dt = tensordict["params", "dt"]
    u = tensordict["action"].squeeze(-1)
    u = u.clamp(-tensordict["params", "max_torque"], tensordict["params", "max_torque"])
    costs = angle_normalize(th) ** 2 + 0.1 * thdot**2 + 0.001 * (u**2)
    new_thdot = thdot + (3 * g_force / (2 * length) * th.sin() + 3.0 / (mass * length**2) * u) * dt
    new_thdot = new_thdot.clamp(-tensordict["params", "max_speed"], tensordict["params", "max_speed"])
    new_th = th + new_thdot * dt
    reward = -costs.view(*tensordict.shape, 1)
    done = torch.zeros_like(reward, dtype=torch.bool)
    return TensorDict(
        {"th": new_th, "thdot": new_thdot, "params": tensordict["params"], "reward": reward, "done": done},
        tensordict.shape,
    )


def _reset(self, tensordict):
    if tensordict is None or tensordict.is_empty():
        tensordict = self.gen_params(batch_size=self.batch_size)
    high_th = torch.tensor(DEFAULT_X, device=self.device)
    high_thdot = torch.tensor(DEFAULT_Y, device=self.device)
    th = torch.rand(tensordict.shape, generator=self.rng, device=self.device) * 2 * high_th - high_th
    thdot = torch.rand(tensordict.shape, generator=self.rng, device=self.device) * 2 * high_thdot - high_thdot
    return TensorDict({"th": th, "thdot": thdot, "params": tensordict["params"]}, batch_size=tensordict.shape)


def tutorial_composite_from_td(td):
    return Composite(
        {
            key: tutorial_composite_from_td(t) if isinstance(t, TensorDictBase)
            else Unbounded(dtype=t.dtype, device=t.device, shape=t.shape)
            for key, t in td.items()
        },
        shape=td.shape,
    )


def _make_spec(self, td_params):
    self.observation_spec = Composite(
        th=Bounded(low=-torch.pi, high=torch.pi, shape=(), dtype=torch.float32),
        thdot=Bounded(low=-td_params["params", "max_speed"], high=td_params["params", "max_speed"],
                      shape=(), dtype=torch.float32),
        params=tutorial_composite_from_td(td_params["params"]),
        shape=(),
    )
    self.state_spec = self.observation_spec.clone()
    self.action_spec = Bounded(low=-td_params["params", "max_torque"], high=td_params["params", "max_torque"],
                               shape=(1,), dtype=torch.float32)
    self.reward_spec = Unbounded(shape=(*td_params.shape, 1))


def _set_seed(self, seed):
    self.rng = torch.manual_seed(seed)


def gen_params(g=10.0, batch_size=None):
    if batch_size is None:
        batch_size = []
    td = TensorDict({"params": TensorDict(
        {"max_speed": 8, "max_torque": 2.0, "dt": 0.05, "g": g, "m": 1.0, "l": 1.0}, [])}, [])
    if batch_size:
        td = td.expand(batch_size).contiguous()
    return td


class TutorialPendulum(EnvBase):
    metadata = {"render_modes": ["human", "rgb_array"], "render_fps": 30}
    batch_locked = False

    def __init__(self, td_params=None, seed=None, device="cpu"):
        if td_params is None:
            td_params = self.gen_params()
        super().__init__(device=device, batch_size=[])
        self._make_spec(td_params)
        if seed is None:
            seed = torch.empty((), dtype=torch.int64).random_().item()
        self.set_seed(seed)

    gen_params = staticmethod(gen_params)
    _make_spec = _make_spec
    _reset = _reset
    _step = staticmethod(_step)
    _set_seed = _set_seed


class SinTransform(Transform):
    def _apply_transform(self, obs):
        return obs.sin()

    def _reset(self, tensordict, tensordict_reset):
        return self._call(tensordict_reset)

    @_apply_to_composite
    def transform_observation_spec(self, observation_spec):
        return Bounded(low=-1, high=1, shape=observation_spec.shape, dtype=observation_spec.dtype,
                       device=observation_spec.device)


class CosTransform(SinTransform):
    def _apply_transform(self, obs):
        return obs.cos()


def test_tutorial_pendulum_single():
    env = TutorialPendulum(seed=0)
    assert env.batch_locked is False
    check_env_specs(env)
    td = env.reset()
    # _reset returned only observations: the done entries are added as False
    for key in ("done", "terminated", "truncated"):
        assert td[key].shape == (1,) and not td[key].any()
    td = env.rand_step(td)
    # _step returned only "done": terminated copies it, truncated is False
    assert torch.equal(td["next", "terminated"], td["next", "done"])
    assert not td["next", "truncated"].any()
    assert env.rollout(3).batch_size == (3,)


def test_tutorial_pendulum_batched_by_input():
    env = TutorialPendulum(seed=0)
    td = env.reset(env.gen_params(batch_size=[10]))
    assert td.batch_size == (10,) and td["th"].shape == (10,) and td["done"].shape == (10, 1)
    td = env.rand_step(td)  # one action per entry of the input
    assert td["action"].shape == (10, 1) and td["next", "reward"].shape == (10, 1)
    assert td["action"].unique().numel() > 1
    rollout = env.rollout(3, auto_reset=False, tensordict=env.reset(env.gen_params(batch_size=[10])))
    assert rollout.batch_size == (10, 3)
    # stateless: the next state is the one the input's state leads to
    assert torch.equal(rollout[:, 1]["th"], rollout[:, 0]["next", "th"])
    # the params travel in the data: another gravity gives another trajectory
    start = env.reset(env.gen_params(batch_size=[10]))
    start["action"] = torch.zeros(10, 1)
    heavy = start.clone()
    heavy["params", "g"] = torch.full((10,), 20.0)
    a, b = env.step(start.clone()), env.step(heavy)
    assert not torch.allclose(a["next", "thdot"], b["next", "thdot"])


def test_tutorial_pendulum_transforms():
    env = TransformedEnv(
        TutorialPendulum(seed=0),
        UnsqueezeTransform(dim=-1, in_keys=["th", "thdot"], in_keys_inv=["th", "thdot"]),
    )
    env.append_transform(SinTransform(in_keys=["th"], out_keys=["sin"]))
    env.append_transform(CosTransform(in_keys=["th"], out_keys=["cos"]))
    env.append_transform(CatTensors(in_keys=["sin", "cos", "thdot"], dim=-1, out_key="observation",
                                    del_keys=False))
    check_env_specs(env)
    assert env.observation_spec["sin"].shape == (1,)
    td = env.reset(env.gen_params(batch_size=[4]))
    r = env.rollout(5, auto_reset=False, tensordict=td)
    assert r.batch_size == (4, 5) and r["next", "observation"].shape == (4, 5, 3)
    # CatTensors sorts its in_keys (TorchRL default): cos, sin, thdot
    torch.testing.assert_close(r["next", "observation"][..., 1:2], r["next", "th"].sin())


# ---------------------------------------------------------------- done completion
class Minimal(EnvBase):
    """Returns only what the test asks for; the rest is completed by EnvBase."""

    def __init__(self, step_keys, batch_size=(2,), done_shape_flat=False):
        super().__init__(batch_size=batch_size)
        bs = self.batch_size
        self.observation_spec = Composite(obs=Unbounded((*bs, 1)), shape=bs)
        self.action_spec = Categorical(2, shape=bs)
        self.step_keys = step_keys
        self.done_shape_flat = done_shape_flat
        self.t = 0

    def _reset(self, td):
        self.t = 0
        return TensorDict(obs=torch.zeros(*self.batch_size, 1), batch_size=self.batch_size)

    def _step(self, td):
        self.t += 1
        bs = self.batch_size
        out = {"obs": torch.full((*bs, 1), float(self.t)), "reward": torch.ones(*bs, 1)}
        shape = bs if self.done_shape_flat else (*bs, 1)
        pattern = torch.tensor([True, False]).expand(*bs).reshape(shape) if bs else torch.tensor([True])
        values = {"done": pattern, "terminated": torch.zeros(shape, dtype=torch.bool) | pattern,
                  "truncated": pattern.clone()}
        for k in self.step_keys:
            out[k] = values[k]
        return TensorDict(out, batch_size=bs)

    def _set_seed(self, seed):
        return seed  # TorchRL allows returning the seed


@pytest.mark.parametrize(
    "keys, want",
    [
        ((), {"done": False, "terminated": False, "truncated": False}),
        (("done",), {"done": True, "terminated": True, "truncated": False}),
        (("terminated",), {"done": True, "terminated": True, "truncated": False}),
        (("truncated",), {"done": True, "terminated": False, "truncated": True}),  # done = te | tr
        (("done", "truncated"), {"done": True, "terminated": False, "truncated": True}),
        (("terminated", "truncated"), {"done": True, "terminated": True, "truncated": True}),
    ],
)
def test_step_completes_done_entries(keys, want):
    env = Minimal(keys)
    td = env.rand_step(env.reset())
    for k, v in want.items():
        assert td["next", k].shape == (2, 1) and td["next", k].dtype is torch.bool
        assert td["next", k][0].item() is v, k  # sub-env 0 has the True pattern
        assert not td["next", k][1].any()
    check_env_specs(env)


def test_done_of_batch_shape_is_reshaped():
    env = Minimal(("done",), done_shape_flat=True)
    td = env.rand_step(env.reset())
    assert td["next", "done"].shape == (2, 1)
    assert td["next", "done"].squeeze(-1).tolist() == [True, False]


def test_completion_inside_transformed_env_and_rollout():
    env = TransformedEnv(Minimal(("done",)))
    r = env.rollout(4, break_when_any_done=False)
    assert r["next", "terminated"].shape == (2, 4, 1)
    assert torch.equal(r["next", "terminated"], r["next", "done"])


def test_set_seed_with_returning_set_seed():
    env = Minimal(())
    assert env.set_seed(3) != 3  # the seed of the next env
    assert env.set_seed(3, static_seed=True) == 3
    assert env.set_seed(None) is None


def test_complete_envs_take_no_completion_after_first_step():
    env = CartPoleEnv(batch_size=[2], seed=0)
    td = env.rand_step(env.reset())
    assert env._plan["done_complete"] is True
    assert sorted(td["next"].keys()) == ["done", "observation", "reward", "terminated", "truncated"]


# ---------------------------------------------------------------- fixes
def test_transformed_reset_runs_reset_preprocess_without_input():
    calls = []

    class Pre(Transform):
        def _reset_env_preprocess(self, tensordict):
            calls.append(tensordict.batch_size)
            return tensordict

    env = TransformedEnv(CartPoleEnv(batch_size=[3], seed=0), Pre())
    td = env.reset()
    assert calls == [torch.Size([3])]
    assert td["observation"].shape == (3, 4)


def test_empty_composite_in_reward_spec():
    class AddEmpty(Transform):
        def _step(self, td, next_td):
            next_td.set("extra", TensorDict({}, next_td.batch_size))
            return next_td

        def transform_reward_spec(self, spec):
            spec.set("extra", Composite(shape=spec.shape))
            return spec

    env = TransformedEnv(PendulumEnv(seed=0, batch_size=[2]), AddEmpty())
    r = env.rollout(3, break_when_any_done=False)
    assert r.batch_size == (2, 3) and "extra" not in r.keys()
    check_env_specs(env)


def test_check_env_specs_action_mask_per_step():
    env = TransformedEnv(TicTacToeEnv(batch_size=[2]), ActionMask())
    check_env_specs(env, seed=0, max_steps=12)  # earlier moves are illegal by the end


def test_check_env_specs_refuses_illegal_masked_action():
    env = TransformedEnv(TicTacToeEnv(batch_size=[2], check=False), ActionMask())

    def first_cell(td):  # plays cell 0 every time: illegal from the second move
        td["action"] = torch.zeros(2, dtype=torch.long)
        return td

    real = env.rollout(3, first_cell, break_when_any_done=False)
    from steersman.envs.utils import _check_masked_action

    with pytest.raises(AssertionError, match="action_mask"):
        _check_masked_action(real, "action", env.action_spec, real["action"], 1)


# ---------------------------------------------------------------- helpers
def test_make_composite_from_td():
    td = TensorDict({"a": torch.zeros(3, 2), "b": {"c": torch.ones(3, dtype=torch.long)},
                     "s": torch.zeros(3)}, [3])
    spec = make_composite_from_td(td)
    assert spec.shape == (3,) and spec["a"].shape == (3, 2) and spec["b", "c"].dtype is torch.long
    assert spec["s"].shape == (3,)
    scal = TensorDict({"g": torch.tensor(9.8)}, [])
    assert make_composite_from_td(scal)["g"].shape == (1,)  # TorchRL's default
    assert make_composite_from_td(scal, unsqueeze_null_shapes=False)["g"].shape == ()
    assert spec.is_in(td)
    with pytest.raises(ValueError, match="dynamic_shape"):
        make_composite_from_td(td, dynamic_shape=True)


@pytest.mark.parametrize("write_full_false", [False, True])
@pytest.mark.parametrize("pattern", [(False, False), (True, False), (True, True)])
def test_terminated_or_truncated(pattern, write_full_false):
    done = torch.tensor(pattern).unsqueeze(-1)
    trunc = torch.tensor([False, True]).unsqueeze(-1)
    data = TensorDict({"done": done, "truncated": trunc,
                       "nested": {"terminated": done.clone()}}, [2])
    want = done | trunc
    assert terminated_or_truncated(data, write_full_false=write_full_false) is bool(want.any())
    assert torch.equal(data["_reset"], want)
    if any(pattern) or write_full_false:
        assert torch.equal(data["nested", "_reset"], done)
    else:
        assert "_reset" not in data["nested"].keys()
    # with a spec: only the leaves it names
    spec = Composite(truncated=Categorical(2, (2, 1), dtype=torch.bool), shape=(2,))
    data2 = TensorDict({"done": done, "truncated": trunc}, [2])
    assert terminated_or_truncated(data2, spec, key="r") is True
    assert torch.equal(data2["r"], trunc)
    assert terminated_or_truncated(data2.clone(), key=None) is True
