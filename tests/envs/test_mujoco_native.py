"""Native MuJoCo tasks: specs on every task, and step-for-step parity with Gymnasium's v5
tasks (same state, same actions: same observations, rewards and terminations)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from steersman import TensorDict
from steersman.envs import AntEnv, HopperEnv, HumanoidEnv, MujocoEnv, Walker2dEnv, check_env_specs

pytest.importorskip("mujoco")
gym = pytest.importorskip("gymnasium")


@pytest.mark.parametrize("cls,obs,act", [(HopperEnv, 11, 3), (Walker2dEnv, 17, 6), (AntEnv, 27, 8),
                                         (HumanoidEnv, 45, 17)], ids=lambda x: getattr(x, "__name__", str(x)))
def test_task_specs_and_partial_resets(cls, obs, act):
    env = cls(num_envs=2, seed=0, max_episode_steps=6)
    assert env.observation_spec["observation"].shape == (2, obs) and env.action_spec.shape == (2, act)
    check_env_specs(env, seed=0)
    r = env.rollout(14, break_when_any_done=False)
    assert bool(r["next", "truncated"][:, 5].all())  # the horizon
    assert r["next", "done"].sum() >= 4


@pytest.mark.parametrize("cls,gid", [(HopperEnv, "Hopper-v5"), (Walker2dEnv, "Walker2d-v5")])
def test_matches_gymnasium_step_for_step(cls, gid):
    genv = gym.make(gid).unwrapped
    genv.reset(seed=0)
    env = cls(num_envs=1, seed=0)
    env.reset()
    d = env.datas[0]
    genv.set_state(d.qpos.copy(), d.qvel.copy())
    rng = np.random.default_rng(0)
    for k in range(15):
        a = rng.uniform(-1, 1, env.action_spec.shape[-1]).astype(np.float32)
        o, r, te, _, _ = genv.step(a)
        out = env.step(TensorDict(action=torch.as_tensor(a).reshape(1, -1), batch_size=[1]))
        np.testing.assert_allclose(out["next", "observation"][0].numpy(), o, atol=1e-5, err_msg=f"step {k}")
        assert out["next", "reward"].item() == pytest.approx(r, abs=1e-4)
        assert bool(out["next", "terminated"].item()) == te
        if te:
            break


def test_seeded_resets_repeat_and_bad_arguments():
    a, b = HopperEnv(num_envs=3, seed=1), HopperEnv(num_envs=3, seed=1)
    torch.testing.assert_close(a.reset()["observation"], b.reset()["observation"])
    assert not torch.equal(a.reset()["observation"][0], a.reset()["observation"][1])
    with pytest.raises(ValueError, match="mjx"):
        HopperEnv(backend="mjx")
    with pytest.raises(ValueError, match="OpenGL"):
        HopperEnv(from_pixels=True)
    with pytest.raises(FileNotFoundError, match="nope.xml"):
        MujocoEnv(xml_path="nope.xml")
    with pytest.raises(ValueError, match="num_envs"):
        AntEnv(num_envs=0)
