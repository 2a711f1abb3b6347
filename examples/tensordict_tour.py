"""A short tour of steersman's container: what an RL loop does with a TensorDict.

Run: ``bash scripts/demo.sh`` (sets up .venv) or ``python examples/tensordict_tour.py``.
"""

from __future__ import annotations

import tempfile
import time

import torch

from steersman import TensorDict, lazy_stack, tensorclass


def rollout(n_envs: int = 8, steps: int = 5) -> TensorDict:
    """Collects a fake rollout: one TensorDict per step, stacked along a time dim."""
    obs = torch.randn(n_envs, 4)
    frames = []
    for _ in range(steps):
        step = TensorDict(
            {
                "observation": obs,
                "action": torch.randint(0, 2, (n_envs, 1)),
                "next": {
                    "observation": obs + 0.1,
                    "reward": torch.ones(n_envs, 1),
                    "done": torch.rand(n_envs, 1) < 0.1,
                },
            },
            batch_size=[n_envs],
        )
        frames.append(step)
        obs = step["next", "observation"]
    return torch.stack(frames, dim=1)  # [n_envs, time]


@tensorclass
class Transition:
    observation: torch.Tensor
    reward: torch.Tensor
    label: str


def main() -> None:
    data = rollout()
    print("rollout:", data.batch_size, "keys:", data.keys(include_nested=True, leaves_only=True))

    # index like a tensor: a time slice, a boolean mask over the batch, a random minibatch
    print("first 3 steps:", data[:, :3].batch_size)
    done = data["next", "done"].squeeze(-1)
    print("done transitions:", data[done].batch_size)
    flat = data.reshape(-1)
    minibatch = flat[torch.randint(0, flat.shape[0], (16,))]
    print("minibatch:", minibatch.batch_size, minibatch["next", "reward"].shape)

    # arithmetic and reductions work across every leaf
    mean = flat.select("observation", ("next", "reward")).float().mean(dim=0)
    print("mean observation:", mean["observation"])

    # ragged trajectories stay lazily stacked
    trajs = lazy_stack([TensorDict({"obs": torch.randn(t, 3)}) for t in (3, 5)])
    print("ragged trajectories:", trajs.batch_size, "second one:", trajs[1]["obs"].shape)

    # a tensorclass is a dataclass that behaves like the container
    tc = Transition(observation=torch.zeros(4, 2), reward=torch.ones(4, 1), label="demo", batch_size=[4])
    print("tensorclass slice:", tc[1:3].observation.shape, tc[0].label)

    # memory-mapped storage survives the process and can be shared with workers
    with tempfile.TemporaryDirectory() as tmp:
        flat.memmap_(tmp)
        back = TensorDict.load_memmap(tmp)
        print("memmap round trip equal:", bool((back == flat).all()))

    # torch.compile traces through TensorDict code without graph breaks
    def advantage(td: TensorDict) -> torch.Tensor:
        td = td.apply(lambda x: x.float())
        return (td["next", "reward"] - td["next", "reward"].mean()).sum()

    compiled = torch.compile(advantage, fullgraph=True)
    t0 = time.perf_counter()
    print("compiled result:", compiled(flat).item(), f"(compile {time.perf_counter() - t0:.1f}s)")


if __name__ == "__main__":
    main()
