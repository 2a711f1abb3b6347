"""PPO's whole iteration as a few compiled graphs, for torch-native envs (``compile=true``).

With ``compile=true`` on a native env with discrete actions, the PPO recipe
(:mod:`steersman.recipes.ppo`) collects, estimates advantages and updates through three
compiled functions, each traced once (``fullgraph=True``, ``dynamic=False``) and called
in a tight loop, with no TensorDict or module machinery per env step or per minibatch:

* **the step** (:class:`FusedCollector`): the policy's MLP on the observations, a
  categorical draw and its log-probability, and the env's own step function (dynamics,
  time limit, auto-reset from its counter-based random stream) -- one graph, called
  ``n_steps`` times per batch on flat tensors;
* **the advantages** (:class:`FusedGAE`): the critic on the batch's observations and
  next observations and GAE as a log-depth scan over time (not a loop unrolled over the
  steps) -- one graph per batch;
* **the update** (:class:`~steersman.recipes.fused_ppo.FusedPPOUpdate`): every epoch and
  minibatch of the iteration -- the clipped loss written out on the MLPs' flat
  parameters, its gradients, clipping and Adam -- as one graph (a ``scan`` over the
  shuffled minibatch indices), one call per batch. Losses it does not cover keep
  :class:`~steersman.objectives.functional_update.CompiledUpdate`, one call per minibatch.

Under inductor the three graphs are saved whole after their first compile and loaded in
later processes (:class:`Precompiled`): as AOTInductor packages, which torch's C++ loader
runs without importing dynamo or inductor, else through torch's precompile (no dynamo
traces or AOTAutograd, but dynamo's and inductor's imports).

The three do what the eager path does, op for op: the action is drawn with
``torch.multinomial`` from the same probabilities (the draw runs from torch's global
generator inside the graph too, so the same seed gives the same actions), the env
step is the env's own function, the GAE is
:func:`~steersman.objectives.value.functional.vec_generalized_advantage_estimate`. A run
with ``compile=true`` therefore equals the eager run of the same seed up to float
rounding (tested over whole iterations), and its batches carry the same entries as
the eager collector's (``("collector", "traj_ids")`` included), so logging, checkpoints
and resume are the recipe's own.

Example::

    from steersman.recipes.ppo import PPOConfig, train
    train(PPOConfig(compile=True), "runs/ppo_fused")   # CartPole-v1 is native: fused path
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn
from torch._higher_order_ops.scan import scan

from steersman.collectors import SyncDataCollector
from steersman.data import Categorical
from steersman.envs.native import NativeEnv
from steersman.envs.native._base import _int_flags_as_bool
from steersman.objectives.value.functional import vec_generalized_advantage_estimate
from steersman.tensordict import TensorDict

from .precompiled import (  # noqa: F401 - INDUCTOR_OPTIONS, TRAIN_OPTIONS, Precompiled... keep their old home
    INDUCTOR_OPTIONS,
    TRAIN_OPTIONS,
    Precompiled,
    _compile,
    compile_options,
    remember_vec_isa,
    wait_for_packages,
)

__all__ = ["INDUCTOR_OPTIONS", "FusedCollector", "FusedGAE", "compile_options", "fusable", "remember_vec_isa"]


def _plain_net(module: nn.Module, in_key: str, out_key: str) -> nn.Module | None:
    """The plain network inside a ``TensorDictModule`` reading ``in_key`` and writing
    ``out_key`` (None if ``module`` is not one)."""
    inner = getattr(module, "module", None)
    if isinstance(inner, nn.Module) and list(getattr(module, "in_keys", [])) == [in_key] \
            and list(getattr(module, "out_keys", [])) == [out_key]:
        return inner
    return None


def _logits_net(actor: nn.Module) -> nn.Module | None:
    """``obs -> logits`` of a categorical ``ProbabilisticActor`` as ``make_policy`` builds it."""
    try:
        head = actor.module[0]
    except (AttributeError, TypeError, IndexError):
        return None
    dist = getattr(actor, "distribution_class", None) or getattr(actor.module[-1], "distribution_class", None)
    if dist is not torch.distributions.Categorical:
        return None
    return _plain_net(head, "observation", "logits")


def fusable(env: Any, actor: nn.Module, critic: nn.Module | None = None) -> str | None:
    """Why the fused iteration cannot run ``actor`` (and ``critic``) on ``env`` (None: it can).

    It needs a torch-native env (:class:`~steersman.envs.native.NativeEnv`) with a
    ``Categorical`` action of one batch dim, on CPU, with a float ``"observation"`` its
    only observation; an actor ``observation -> logits -> Categorical`` and a critic
    ``observation -> state_value`` (what :func:`~steersman.recipes.ppo.make_policy` and
    ``make_critic`` build for discrete actions)."""
    if not isinstance(env, NativeEnv):
        return f"{type(env).__name__} is not a torch-native env"
    if env.device.type != "cpu" or len(env.batch_size) != 1:
        return "the fused step runs a CPU env of one batch dim"
    if not isinstance(env.action_spec, Categorical) or env.action_spec.shape != env.batch_size:
        return f"{type(env).__name__}'s action is not one Categorical per sub-env"
    if list(env.observation_spec.keys()) != ["observation"] or env._obs_key != "observation":
        return f"{type(env).__name__} observes more than 'observation'"
    if not env.observation_spec["observation"].dtype.is_floating_point:
        return f"{type(env).__name__}'s observation is not a float vector"
    if _logits_net(actor) is None:
        return "the actor is not observation -> logits -> Categorical"
    if critic is not None and _plain_net(critic, "observation", "state_value") is None:
        return "the critic is not observation -> state_value"
    return None


def _program(net: nn.Module, names: list[str], prefix: str = "") -> list[tuple] | None:
    """``net`` as a list of steps over the flat leaves ``names`` (its parameters named
    ``prefix + ...``), if it is a plain stack of ``nn.Linear`` and parameter-free layers
    (``make_policy``'s and ``make_critic``'s MLPs): ``("linear", weight index, bias index or
    None)`` or ``("call", layer)``. None: something else (``functional_call`` then)."""
    if not isinstance(net, nn.Sequential) or getattr(net, "_out_shape", None) is not None:
        return None
    index = {name: i for i, name in enumerate(names)}
    steps: list[tuple] = []
    for key, layer in net.named_children():
        if type(layer) is nn.Linear and f"{prefix}{key}.weight" in index:
            steps.append(("linear", index[f"{prefix}{key}.weight"], index.get(f"{prefix}{key}.bias")))
        elif next(layer.parameters(), None) is None and next(layer.buffers(), None) is None:
            steps.append(("call", layer))
        else:
            return None
    return steps


def _run_net(net: nn.Module, names: list[str], program: list[tuple] | None, params: tuple, x: Tensor) -> Tensor:
    """``net(x)`` with ``params`` (in ``names``' order) in place of its parameters: the
    layers one by one when ``program`` has them (the same ops as the modules' forwards,
    and a third of dynamo's trace of ``torch.func.functional_call``), else
    ``functional_call``."""
    if program is None:
        return torch.func.functional_call(net, dict(zip(names, params)), (x,))
    return _run_program(program, params, x)


def _run_program(program: list[tuple], params: tuple, x: Tensor) -> Tensor:
    """The network of :func:`_program` on ``x`` with the leaves ``params``: the modules' own ops."""
    for step in program:
        if step[0] == "linear":
            x = torch.nn.functional.linear(x, params[step[1]], None if step[2] is None else params[step[2]])
        else:
            x = step[1](x)
    return x


def _flat(net: nn.Module) -> tuple[list[str], tuple[Tensor, ...]]:
    named = list(net.named_parameters())
    return [n for n, _ in named], tuple(p.detach() for _, p in named)


def _stance(warm: bool) -> Any:
    """Skips dynamo's guards once a graph has compiled: the inputs keep their shapes and
    dtypes and the Python-level settings (the env's constants) never change, while at
    these sizes the guards cost as much as the graph (as in ``CompiledUpdate``). Without
    dynamo in the process (the graphs are AOTInductor packages) there are no guards to skip."""
    if not warm or "torch._dynamo" not in sys.modules:
        return contextlib.nullcontext()
    return torch.compiler.set_stance(skip_guard_eval_unsafe=True)


@contextlib.contextmanager
def cacheable_scan() -> Iterator[None]:
    """Lets inductor's on-disk caches (FX graph and AOTAutograd) store and reuse a graph
    that contains a ``scan``, for the compiles that happen inside the block.

    torch 2.13 opts higher-order ops into these caches one by one and ``scan`` is not
    among them, so without this the rollout graph is traced, functionalized and code
    generated again in every process (~10 s CPU of a warm start). The cache key already
    covers a ``scan``'s body (its subgraph is pickled into the key with the outer
    graph), and the compiled output is ordinary wrapper code and kernels. The opt-in is
    scoped: it is restored on exit, so other code's scans in the process keep torch's
    default.
    """
    try:
        from torch._higher_order_ops.scan import scan_op
    except ImportError:  # pragma: no cover - another torch layout: nothing to opt in
        yield
        return
    before = getattr(scan_op, "_cacheable", None)
    if before is None:  # pragma: no cover
        yield
        return
    scan_op._cacheable = True
    try:
        yield
    finally:
        scan_op._cacheable = before


class FusedCollector(SyncDataCollector):
    """A :class:`~steersman.collectors.SyncDataCollector` of a categorical policy on a
    torch-native env whose per-step work is one compiled function.

    Each step is ``step(params, obs, state, steps, rng) -> (action, logits, log_prob,
    next obs, reward, flags, state', steps', rng', obs after reset)``: the policy's MLP
    with the current parameters swapped in (layer by layer, see :func:`_run_net`), the draw of
    :class:`torch.distributions.Categorical` (``multinomial`` of the softmax, from torch's
    global generator: the eager policy's numbers), and the env's own step function with
    auto-reset. The batch is the eager collector's: same entries, same layout, same
    trajectory ids and ``state_dict`` (a checkpoint of either resumes in either).

    Args:
        env: a torch-native env (see :func:`fusable`).
        policy: the collection policy (``make_policy``'s categorical actor, or a
            ``shared_copy`` of it); its parameters are read at the start of each batch.
        frames_per_batch, total_frames: as the parent's.
        compile: compile the step (False: the same step runs eagerly).
        backend: ``torch.compile``'s backend.
        options: inductor's options (None: :data:`INDUCTOR_OPTIONS`).

    Raises:
        ValueError: if the env or policy cannot be fused (the reason from :func:`fusable`).

    Example::

        collector = FusedCollector(CartPoleEnv(batch_size=[8], seed=0), policy,
                                   frames_per_batch=256, total_frames=100_000)
        for batch in collector:   # [8, 32], the eager collector's entries
            ...
    """

    def __init__(self, env: NativeEnv, policy: nn.Module, *, frames_per_batch: int, total_frames: int,
                 compile: bool = True, backend: Any = "inductor", options: dict[str, Any] | None = None) -> None:
        why = fusable(env, policy)
        if why is not None:
            raise ValueError(f"FusedCollector: {why}")
        super().__init__(env, policy, frames_per_batch=frames_per_batch, total_frames=total_frames)
        self._net = _logits_net(policy)
        self._names, _ = _flat(self._net)
        self._program = _program(self._net, self._names)
        self._kernel = type(env)._kernel
        self._time = torch.zeros(self._steps_per_batch, 0)  # what the scan runs over
        self.compiled = compile
        self._fn = _compile(self._rollout_fn, backend, options) if compile else self._rollout_fn
        self._warm = False  # the rollout has compiled: later calls skip dynamo's guards

    @property
    def graph(self) -> Any:
        """The compiled rollout (a :class:`~steersman.recipes.precompiled.Precompiled` under
        inductor), or the eager function."""
        return self._fn

    def use_eager(self) -> None:
        """Runs the rollout eagerly from now on (the same steps; for a process that must not
        compile it, e.g. a :func:`~steersman.recipes.precompiled.compile_ahead` child)."""
        self._fn, self.compiled = self._rollout_fn, False

    def _call(self, *args: Any) -> tuple:
        if not self.compiled:
            return self._fn(*args)
        try:
            return self._fn(*args)
        except torch._dynamo.exc.TorchDynamoException as err:  # the step is pure: nothing changed
            reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            warnings.warn(f"compile=true: the rollout of {type(self.env).__name__} cannot be compiled ({reason}); "
                          "running it eagerly", stacklevel=3)
            self._fn, self.compiled = self._rollout_fn, False
            return self._fn(*args)

    def _step(self, params: tuple, obs: Tensor, state: Tensor, steps: Tensor, rng: Tensor) -> tuple:
        env = self.env
        logits = _run_net(self._net, self._names, self._program, params, obs)
        # torch.distributions.Categorical(logits=logits): normalised logits, probs their softmax
        log_pmf = logits - logits.logsumexp(-1, keepdim=True)
        probs = torch.softmax(log_pmf, -1)
        action = torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, True).T.reshape(probs.shape[:-1])
        log_prob = log_pmf.gather(-1, action.unsqueeze(-1)).squeeze(-1)
        state, steps, rng, (nobs, reward, flags), robs = self._kernel(
            state, steps, rng, env._offsets, action, env._c_float, 1, env.max_episode_steps, True, env._udtype, True)
        return action, logits, log_prob, nobs, reward, flags, state, steps, rng, robs

    def _rollout_fn(self, params: tuple, obs: Tensor, state: Tensor, steps: Tensor, rng: Tensor, time: Tensor
                    ) -> tuple:
        """``T = len(time)`` steps: the last carry ``(obs, state, steps, rng)`` and the steps'
        outputs stacked ``[T, ...]``. Compiled, one ``scan`` (a loop inside the graph, not
        unrolled); eager, the same body in a Python loop."""
        def body(carry: tuple, _: Tensor) -> tuple:
            obs, state, steps, rng = carry
            action, logits, log_prob, nobs, reward, flags, state, steps, rng, robs = self._step(
                params, obs, state, steps, rng)
            # (contiguous copies: a higher-order op's outputs may not alias each other or its inputs, and
            # the carry keeps the layout of the initial one)
            robs, obs, nobs = (t.clone(memory_format=torch.contiguous_format) for t in (robs, obs, nobs))
            return (robs, state, steps, rng), (obs, action.clone(), logits, log_prob, nobs, reward.clone(), flags)

        if torch.compiler.is_compiling():
            return scan(body, (obs, state, steps, rng), time)
        carry, outs = (obs, state, steps, rng), []
        for t in time:
            carry, out = body(carry, t)
            outs.append(out)
        return carry, tuple(torch.stack(v) for v in zip(*outs))

    def _rollout_once(self, random: bool) -> Any:
        if random or self.reset_at_each_iter or self.max_frames_per_traj is not None or self.track_policy_version:
            return super()._rollout_once(random)  # what the fused step does not do
        if self._closed:
            raise RuntimeError("Collector: the collector was shut down")
        if self._carried is None:
            self._reset_all()
        env = self.env
        _, params = _flat(self._net)
        # a contiguous copy: after a reset the observation is a (transposed) view of the state, a scan's
        # inputs may not alias, and the graph (its guards skipped) is specialised to one memory layout
        carry = tuple(t.clone(memory_format=torch.contiguous_format)
                      for t in (self._carried.get("observation"), env._state, env._steps, env._rng))
        with torch.no_grad(), _stance(self._warm), contextlib.nullcontext() if self._warm else cacheable_scan():
            (obs, state, steps, rng), (obs_t, action, logits, log_prob, nobs, reward, flags) = self._call(
                params, *carry, self._time)
        self._warm = self.compiled
        env._state, env._steps, env._rng = state, steps, rng
        done, term, trunc = _int_flags_as_bool(flags.movedim(0, 1))  # [T, n, 1] each
        false = torch.zeros_like(done)
        first = TensorDict({"observation": obs_t[0], "done": false[0], "terminated": false[0],
                            "truncated": false[0], "logits": logits[0], "action": action[0],
                            "action_log_prob": log_prob[0],
                            "next": {"observation": nobs[0], "reward": reward[0], "done": done[0],
                                     "terminated": term[0], "truncated": trunc[0]}}, env.batch_size)
        buf = self._buffer_for(first)
        views = dict(zip(buf.layout.keys, buf.views))
        for key, value in ((("observation",), obs_t), (("done",), false), (("terminated",), false),
                           (("truncated",), false), (("logits",), logits), (("action",), action),
                           (("action_log_prob",), log_prob), (("next", "observation"), nobs),
                           (("next", "reward"), reward), (("next", "done"), done),
                           (("next", "terminated"), term), (("next", "truncated"), trunc)):
            views[key].copy_(value.reshape(views[key].shape))
        self._carried = TensorDict({"observation": obs, "done": false[0].clone(), "terminated": false[0].clone(),
                                    "truncated": false[0].clone(), "logits": logits[-1],
                                    "action_log_prob": log_prob[-1]}, env.batch_size)
        return self._finish_rollout(buf)


class FusedGAE:
    """GAE of a ``[n, T]`` batch as one compiled function: the critic's MLP on the
    observations and next observations (current parameters swapped in) and
    :func:`~steersman.objectives.value.functional.vec_generalized_advantage_estimate`
    (a log-depth scan over time), writing ``"advantage"``, ``"value_target"``,
    ``"state_value"`` and ``("next", "state_value")`` as the eager
    :class:`~steersman.objectives.value.GAE` does.

    Args:
        critic: ``observation -> state_value`` (``make_critic``'s).
        gamma, lmbda: discount and λ.
        compile, backend, options: as :class:`FusedCollector`'s.

    Example::

        gae = FusedGAE(critic, gamma=0.98, lmbda=0.8)
        gae(batch)   # batch [n, T] from a collector: advantages written in place
    """

    def __init__(self, critic: nn.Module, *, gamma: float, lmbda: float, compile: bool = True,
                 backend: Any = "inductor", options: dict[str, Any] | None = None) -> None:
        net = _plain_net(critic, "observation", "state_value")
        if net is None:
            raise ValueError("FusedGAE: the critic is not observation -> state_value")
        self._net, self.gamma, self.lmbda = net, float(gamma), float(lmbda)
        self._names, _ = _flat(net)
        self._program = _program(net, self._names)
        self._fn = _compile(self._gae, backend, options) if compile else self._gae
        self._warm = False

    def _gae(self, params: tuple, obs: Tensor, next_obs: Tensor, reward: Tensor, done: Tensor,
             terminated: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        value = _run_net(self._net, self._names, self._program, params, obs)
        next_value = _run_net(self._net, self._names, self._program, params, next_obs)
        adv, target = vec_generalized_advantage_estimate(self.gamma, self.lmbda, value, next_value, reward, done,
                                                         terminated, time_dim=-2)
        return adv, target, value, next_value

    def use_eager(self) -> None:
        """Computes GAE eagerly from now on (see :meth:`FusedCollector.use_eager`)."""
        self._fn = self._gae

    def __call__(self, batch: TensorDict) -> TensorDict:
        _, params = _flat(self._net)
        nxt = batch.get("next")
        with torch.no_grad(), _stance(self._warm):
            adv, target, value, next_value = self._fn(params, batch.get("observation"), nxt.get("observation"),
                                                      nxt.get("reward"), nxt.get("done"), nxt.get("terminated"))
        self._warm = self._fn is not self._gae
        batch.set("advantage", adv)
        batch.set("value_target", target)
        batch.set("state_value", value)
        nxt.set("state_value", next_value)
        return batch
