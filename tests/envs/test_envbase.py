"""EnvBase contract (with small Python envs), step_mdp and check_env_specs."""

from __future__ import annotations

import pytest
import torch

from steersman import TensorDict
from steersman.data import Bounded, Categorical, Composite, OneHot, Unbounded
from steersman.envs import EnvBase, EnvClosedError, InvalidActionError, check_env_specs, step_mdp
from steersman.envs.utils import next_seed


class CountEnv(EnvBase):
    """A stateful test env: ``count += action``; terminated when ``count >= target``.

    Each sub-env also reports a per-sub-env ``truncated`` after ``limit`` steps.
    """

    def __init__(self, batch_size=(), target=5.0, limit=100, bad=None):
        super().__init__(batch_size=batch_size)
        bs = self.batch_size
        self.target, self.limit, self.bad = target, limit, bad
        self.observation_spec = Composite(count=Unbounded((*bs, 1)), shape=bs)
        self.action_spec = Bounded(0.0, 2.0, shape=(*bs, 1))
        self.count = torch.zeros(*bs, 1)
        self.steps = torch.zeros(*bs, 1, dtype=torch.long)
        self.seed = None
        self.closed_calls = 0

    def _reset(self, td, **kwargs):
        mask = self._reset_mask(td)
        fresh = torch.full_like(self.count, float(kwargs.get("start", 0.0)))
        if mask is None:
            self.count, self.steps = fresh, torch.zeros_like(self.steps)
        else:
            m = mask.unsqueeze(-1)
            self.count = torch.where(m, fresh, self.count)
            self.steps = torch.where(m, 0, self.steps)
        f = torch.zeros(*self.batch_size, 1, dtype=torch.bool)
        # deliberately garbage for the sub-envs that are not reset: EnvBase must merge
        count = self.count.clone() if mask is None else torch.full_like(self.count, -99.0).where(
            ~mask.unsqueeze(-1), self.count)
        return TensorDict({"count": count, "done": f, "terminated": f.clone(), "truncated": f.clone()},
                          batch_size=self.batch_size)

    def _step(self, td):
        self.count = self.count + td["action"]
        self.steps = self.steps + 1
        term = self.count >= self.target
        trunc = self.steps >= self.limit
        out = {"count": self.count.clone(), "reward": td["action"].clone(), "done": term | trunc,
               "terminated": term, "truncated": trunc}
        if self.bad == "extra":
            out["junk"] = torch.zeros(*self.batch_size, 2)
        if self.bad == "dtype":
            out["count"] = out["count"].double()
        if self.bad == "shape":
            out["reward"] = out["reward"].expand(*self.batch_size, 2).clone()
        if self.bad == "done":
            out["done"] = torch.zeros_like(term)
        return TensorDict(out, batch_size=self.batch_size)

    def _set_seed(self, seed):
        self.seed = seed

    def _close(self):
        self.closed_calls += 1


shapes = pytest.mark.parametrize("bs", [(), (3,), (2, 2)], ids=lambda s: f"bs{list(s)}")


@shapes
def test_check_env_specs_passes_and_default_specs(bs):
    env = CountEnv(batch_size=bs)
    check_env_specs(env)
    assert env.reward_spec == Unbounded((*bs, 1))
    done = env.full_done_spec
    assert done.keys() == ["done", "terminated", "truncated"]
    assert done["done"].dtype is torch.bool and done["done"].shape == (*bs, 1)
    assert isinstance(env.action_spec, Bounded) and env.full_action_spec["action"] is env.action_spec
    assert env.state_spec.is_empty()


@pytest.mark.parametrize(
    "bad, match",
    [
        ("extra", r"rollout of CountEnv failed.*'junk'"),
        ("dtype", r"key .*'count'.* has dtype torch.float64"),
        ("shape", r"\('next', 'reward'\) has shape"),
        ("done", r"\('next', 'done'\) differs from terminated \| truncated"),
    ],
)
def test_check_env_specs_names_the_offending_key(bad, match):
    env = CountEnv(batch_size=[2], bad=bad, target=1.0)
    with pytest.raises(AssertionError, match=match):
        check_env_specs(env)


def test_check_env_specs_catches_out_of_bounds_values_and_missing_keys():
    env = CountEnv(batch_size=[2])
    env.observation_spec = Composite(count=Bounded(0.0, 0.5, shape=(2, 1)), shape=[2])
    with pytest.raises(AssertionError, match=r"key .*'count'.* holds values outside its spec.*out of bounds"):
        check_env_specs(env, seed=0)
    env = CountEnv(batch_size=[2])
    env.observation_spec = Composite(count=Unbounded((2, 1)), speed=Unbounded((2, 1)), shape=[2])
    with pytest.raises(AssertionError, match=r"key 'speed' is declared in the specs but missing"):
        check_env_specs(env)


def test_check_env_specs_dtype_check_can_be_disabled():
    env = CountEnv(batch_size=[2], bad="dtype")
    check_env_specs(env, check_dtype=False)


def test_spec_setters_validate_batch_shape():
    env = CountEnv(batch_size=[3])
    with pytest.raises(ValueError, match=r"does not start with the env batch size \[3\]"):
        env.action_spec = Bounded(0.0, 1.0, shape=(1,))
    with pytest.raises(TypeError, match="must be a Composite"):
        env.observation_spec = Unbounded((3, 1))
    with pytest.raises(ValueError, match="Composite has shape"):
        env.observation_spec = Composite(x=Unbounded((4, 1)), shape=[4])
    # an unbatched Composite of batched leaves adopts the batch size
    env.observation_spec = Composite(count=Unbounded((3, 1)))
    assert env.observation_spec.shape == (3,)
    env.done_spec = Categorical(2, shape=(3, 1), dtype=torch.bool)
    assert env.done_keys == ["done", "terminated", "truncated"]
    env.reward_spec = Composite(reward=Unbounded((3, 1)), bonus=Unbounded((3, 1)), shape=[3])
    assert isinstance(env.reward_spec, Composite) and env.reward_keys == ["reward", "bonus"]
    with pytest.raises(KeyError, match="2 reward keys"):
        env.reward_key  # noqa: B018


def test_specs_are_locked_until_unlocked():
    env = CountEnv(batch_size=[2])
    with pytest.raises(RuntimeError, match="locked"):
        env.observation_spec["other"] = Unbounded((2, 1))
    env.set_spec_lock_(False)
    env.observation_spec["other"] = Unbounded((2, 1))
    env.set_spec_lock_(True)
    assert env.observation_keys == ["count", "other"]


@shapes
def test_reset_step_and_rollout_layout(bs):
    env = CountEnv(batch_size=bs)
    td = env.reset()
    assert td.batch_size == torch.Size(bs) and not td["done"].any()
    td["action"] = torch.ones(*bs, 1)
    out = env.step(td)
    assert out is td
    assert torch.equal(td["next", "count"], torch.ones(*bs, 1))
    ro = env.rollout(4, break_when_any_done=False)
    assert ro.batch_size == torch.Size((*bs, 4))
    assert ro["next", "reward"].shape == torch.Size((*bs, 4, 1))


def test_partial_reset_merges_the_others_from_the_input():
    env = CountEnv(batch_size=[3])
    td = env.reset()
    td["action"] = torch.tensor([[1.0], [2.0], [0.5]])
    td = step_mdp(env.step(td))
    td["_reset"] = torch.tensor([[False], [True], [False]])
    out = env.reset(td, start=0.25)
    assert out["count"].squeeze(-1).tolist() == [1.0, 0.25, 0.5]  # not the -99 of _reset
    assert "_reset" not in out.keys() and "_reset" in td.keys()  # the input is not modified
    assert env.count.squeeze(-1).tolist() == [1.0, 0.25, 0.5]


def test_generic_step_and_maybe_reset_resets_only_done_sub_envs():
    env = CountEnv(batch_size=[3], target=2.0)
    td = env.reset()
    td["action"] = torch.tensor([[2.0], [1.0], [0.0]])
    cur, nxt = env.step_and_maybe_reset(td)
    assert cur["next", "done"].squeeze(-1).tolist() == [True, False, False]
    assert nxt["count"].squeeze(-1).tolist() == [0.0, 1.0, 0.0]
    assert not nxt["done"].any() and "_reset" not in nxt.keys() and "action" not in nxt.keys()
    assert env.count.squeeze(-1).tolist() == [0.0, 1.0, 0.0]


def test_truncated_sub_envs_are_reset_too():
    env = CountEnv(batch_size=[2], target=100.0, limit=2)
    ro = env.rollout(5, policy=lambda td: td.set("action", torch.ones(2, 1)), break_when_any_done=False)
    assert ro["next", "truncated"].squeeze(-1)[0].tolist() == [False, True, False, True, False]
    assert ro["next", "count"].squeeze(-1)[0].tolist() == [1.0, 2.0, 1.0, 2.0, 1.0]


def test_rollout_break_flags():
    env = CountEnv(batch_size=[2], target=3.0)

    def policy(td):
        return td.set("action", torch.tensor([[1.0], [0.5]]))

    ro = env.rollout(10, policy)  # break when any done: sub-env 0 after 3 steps
    assert ro.batch_size == (2, 3)
    ro = env.rollout(10, policy, break_when_any_done=False, break_when_all_done=True)
    assert ro.batch_size == (2, 6)
    assert ro["next", "count"][0].squeeze(-1).tolist() == [1.0, 2.0, 3.0, 3.0, 3.0, 3.0]
    assert ro["next", "count"][1].squeeze(-1).tolist() == [0.5, 1.0, 1.5, 2.0, 2.5, 3.0]
    ro = env.rollout(4, policy, break_when_any_done=False, set_truncated=True, return_contiguous=False)
    assert ro["next", "truncated"][:, -1].all()
    assert type(ro).__name__ == "LazyStackedTensorDict"


def test_rand_action_and_rand_step():
    env = CountEnv(batch_size=[4])
    td = env.rand_action()
    assert env.action_spec.is_in(td["action"]) and td.batch_size == (4,)
    out = env.rand_step(env.reset())
    assert out["next", "count"].shape == (4, 1)
    assert env.rand_step()["next", "reward"].shape == (4, 1)


def test_seeding_contract():
    env = CountEnv(batch_size=[2])
    assert env.set_seed(3) == next_seed(3) and env.seed == 3
    assert env.set_seed(3, static_seed=True) == 3
    assert env.set_seed(None) is None
    seeds = [0]
    for _ in range(5):
        seeds.append(CountEnv().set_seed(seeds[-1]))
    assert len(set(seeds)) == 6


def test_close_is_idempotent_and_blocks_use():
    env = CountEnv(batch_size=[2])
    with env as e:
        assert e is env
    assert env.is_closed and env.closed_calls == 1
    env.close()
    assert env.closed_calls == 1
    with pytest.raises(EnvClosedError, match="CountEnv is closed"):
        env.reset()
    with pytest.raises(EnvClosedError):
        env.step(TensorDict({"action": torch.ones(2, 1)}, batch_size=[2]))


def test_step_check_flag():
    env = CountEnv(batch_size=[2])
    td = env.reset()
    td["action"] = torch.tensor([[1.0], [5.0]])
    env.step(td)  # continuous bounds: not checked by default
    with pytest.raises(InvalidActionError, match=r"CountEnv.step: action 'action' = \[\[1\.0\], \[5\.0\]\] is outside"
                       r" the action spec Bounded.*5\.0 is not in \[0\.0, 2\.0\]"):
        env.step(td, check=True)
    td["action"] = torch.ones(2, 2)
    with pytest.raises(ValueError, match=r"has shape \[2, 2\]"):
        env.step(td, check=True)
    with pytest.raises(KeyError, match="no action entry"):
        env.step(TensorDict({}, batch_size=[2]), check=True)


def test_fake_tensordict_and_repr():
    env = CountEnv(batch_size=[2])
    fake = env.fake_tensordict()
    assert set(fake.keys(include_nested=True, leaves_only=True)) == {
        "count", "action", "done", "terminated", "truncated",
        ("next", "count"), ("next", "reward"), ("next", "done"), ("next", "terminated"),
        ("next", "truncated"),
    }
    r = repr(env)
    assert "CountEnv(" in r and "batch_size=torch.Size([2])" in r


def test_subclass_must_implement_the_three_methods():
    class Incomplete(EnvBase):
        pass

    env = Incomplete()
    with pytest.raises(NotImplementedError, match="_reset"):
        env.reset()
    with pytest.raises(NotImplementedError, match="_step"):
        env.step(TensorDict({}, batch_size=[]))
    with pytest.raises(NotImplementedError, match="_set_seed"):
        env.set_seed(0)


# ----------------------------------------------------------------------------- step_mdp
def _transition(bs=(3,)):
    return TensorDict({
        "observation": torch.zeros(*bs, 2), "action": torch.ones(*bs, 1), "hidden": torch.ones(*bs, 4),
        "done": torch.ones(*bs, 1, dtype=torch.bool), "_reset": torch.ones(*bs, 1, dtype=torch.bool),
        "next": {"observation": torch.ones(*bs, 2), "reward": torch.ones(*bs, 1),
                 "done": torch.zeros(*bs, 1, dtype=torch.bool),
                 "terminated": torch.zeros(*bs, 1, dtype=torch.bool),
                 "truncated": torch.zeros(*bs, 1, dtype=torch.bool)},
    }, batch_size=bs)


def test_step_mdp_defaults():
    td = _transition()
    out = step_mdp(td)
    assert sorted(out.keys()) == ["done", "hidden", "observation", "terminated", "truncated"]
    assert out["observation"] is td["next", "observation"]  # shared, not copied
    assert not out["done"].any()  # next's done replaces the root's
    assert "next" in td.keys()  # the input is untouched


def test_step_mdp_options():
    td = _transition()
    assert sorted(step_mdp(td, keep_other=False).keys()) == ["done", "observation", "terminated", "truncated"]
    assert "reward" in step_mdp(td, exclude_reward=False).keys()
    assert "action" in step_mdp(td, exclude_action=False).keys()
    assert "done" not in step_mdp(td, exclude_done=True).keys()
    dest = TensorDict({"stale": torch.zeros(3)}, batch_size=[3])
    out = step_mdp(td, next_tensordict=dest)
    assert out is dest and "observation" in dest.keys()


def test_step_mdp_nested_keys():
    td = TensorDict({
        "agents": {"obs": torch.zeros(2, 3), "action": torch.ones(2, 1)},
        "next": {"agents": {"obs": torch.ones(2, 3), "reward": torch.ones(2, 1)}},
    }, batch_size=[2])
    out = step_mdp(td, reward_keys=[("agents", "reward")], action_keys=[("agents", "action")])
    assert set(out.keys(include_nested=True, leaves_only=True)) == {("agents", "obs")}
    assert (out["agents", "obs"] == 1).all()


def test_step_mdp_merges_nested_entries_and_needs_next():
    td = TensorDict({
        "sub": {"keep": torch.zeros(2), "x": torch.zeros(2)},
        "next": {"sub": {"x": torch.ones(2)}},
    }, batch_size=[2])
    out = step_mdp(td)
    assert out["sub", "keep"].tolist() == [0.0, 0.0] and out["sub", "x"].tolist() == [1.0, 1.0]
    with pytest.raises(KeyError, match="no 'next' entry"):
        step_mdp(TensorDict({"a": torch.zeros(2)}, batch_size=[2]))


def test_step_mdp_on_a_lazy_stack():
    from steersman.tensordict import lazy_stack

    td = lazy_stack([_transition(()), _transition(())], 0)
    out = step_mdp(td)
    assert out.batch_size == (2,)
    assert (out["observation"] == 1).all() and "action" not in out.keys()


def test_one_hot_action_spec_is_kept_as_leaf():
    env = CountEnv(batch_size=[2])
    env.action_spec = OneHot(3, shape=(2, 3))
    assert isinstance(env.action_spec, OneHot) and env.action_keys == ["action"]
