"""TensorDictModule, TensorDictSequential, WrapModule, dispatch, interaction types, mappings.

The battery at the top runs every module kind (plain, sequential, probabilistic) on
every batch shape; the sections below test one feature each.
"""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

from steersman.tensordict import TensorDict, lazy_stack
from steersman.tensordict.nn import (
    ExplorationType,
    InteractionType,
    NormalParamExtractor,
    ProbabilisticTensorDictModule,
    ProbabilisticTensorDictSequential,
    TensorDictModule,
    TensorDictModuleBase,
    TensorDictSequential,
    WrapModule,
    biased_softplus,
    dispatch,
    exploration_type,
    interaction_type,
    mappings,
    set_exploration_type,
    set_interaction_type,
)

OBS, ACT = 3, 2
BATCHES = [(), (4,), (2, 3)]
KINDS = ["plain", "sequential", "probabilistic"]


def _mlp(i: int, o: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(i, 8), nn.Tanh(), nn.Linear(8, o))


def build(kind: str):
    """(module, reference fn obs -> {key: expected}) for one module kind."""
    if kind == "plain":
        net = _mlp(OBS, ACT)
        return TensorDictModule(net, ["obs"], ["action"]), lambda x: {"action": net(x)}
    if kind == "sequential":
        a, b = _mlp(OBS, 5), _mlp(5, ACT)
        seq = TensorDictSequential(
            TensorDictModule(a, ["obs"], ["hidden"]), TensorDictModule(b, ["hidden"], ["action"])
        )
        return seq, lambda x: {"hidden": a(x), "action": b(a(x))}
    net = nn.Sequential(_mlp(OBS, 2 * ACT), NormalParamExtractor())
    policy = ProbabilisticTensorDictSequential(
        TensorDictModule(net, ["obs"], ["loc", "scale"]),
        ProbabilisticTensorDictModule(
            ["loc", "scale"], ["action"], torch.distributions.Normal, return_log_prob=True
        ),
    )

    def ref(x):
        loc, scale = net(x)
        d = torch.distributions.Normal(loc, scale)
        return {"loc": loc, "scale": scale, "action": loc, "action_log_prob": d.log_prob(loc)}

    return policy, ref


def make_td(batch, seed: int = 1) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    return TensorDict(
        obs=torch.randn(*batch, OBS, generator=g), other=torch.zeros(*batch, 1), batch_size=batch
    )


# ----------------------------------------------------------------------------- battery
@pytest.mark.parametrize("batch", BATCHES, ids=str)
@pytest.mark.parametrize("kind", KINDS)
class TestBattery:
    def test_call_writes_outputs_in_place(self, kind, batch):
        module, ref = build(kind)
        td = make_td(batch)
        obs, other = td["obs"], td["other"]
        out = module(td)
        assert out is td
        expected = ref(obs)
        assert set(module.out_keys) == set(expected)
        for key, value in expected.items():
            assert td[key].shape == torch.Size(batch) + value.shape[len(batch):]
            torch.testing.assert_close(td[key], value)
        assert td["obs"] is obs and td["other"] is other  # inputs untouched

    def test_keys(self, kind, batch):
        module, ref = build(kind)
        assert module.in_keys == ["obs"]
        assert list(module.out_keys) == list(ref(torch.zeros(OBS)))

    def test_keyword_call_returns_tensors(self, kind, batch):
        module, ref = build(kind)
        td = make_td(batch)
        out = module(obs=td["obs"])
        expected = ref(td["obs"])
        if len(module.out_keys) == 1:
            out = (out,)
        assert isinstance(out, tuple) and len(out) == len(module.out_keys)
        for key, value in zip(module.out_keys, out):
            torch.testing.assert_close(value, expected[key])
        positional = module(td["obs"])
        torch.testing.assert_close(positional if len(module.out_keys) == 1 else positional[-1],
                                   out[-1])

    def test_missing_key_raises_and_leaves_td_unchanged(self, kind, batch):
        module, _ = build(kind)
        td = TensorDict(observation=torch.randn(*batch, OBS), batch_size=batch)
        before = dict(td.items())
        with pytest.raises(KeyError) as info:
            module(td)
        msg = str(info.value)
        assert "'obs'" in msg and "observation" in msg
        assert "TensorDictModule" in msg or "Probabilistic" in msg
        if kind != "plain":
            assert "module 0 of" in msg
        assert dict(td.items()).keys() == before.keys()
        assert all(td[k] is v for k, v in before.items())

    def test_tensordict_out(self, kind, batch):
        module, ref = build(kind)
        td = make_td(batch)
        dest = TensorDict(batch_size=batch)
        out = module(td, tensordict_out=dest)
        assert out is dest
        assert "action" in dest and "action" not in td
        torch.testing.assert_close(dest["action"], ref(td["obs"])["action"])

    def test_lazy_stack_input(self, kind, batch):
        # a lazy stack has at least one batch dim: stack members of the given batch shape
        module, ref = build(kind)
        dense = torch.stack([make_td(batch) for _ in range(3)], 0)
        lazy = lazy_stack([dense[i] for i in range(3)], 0)
        module(lazy)
        torch.testing.assert_close(lazy["action"], ref(dense["obs"])["action"])


# ----------------------------------------------------------------------------- TensorDictModule
class TestTensorDictModule:
    def test_nested_keys_in_and_out(self):
        m = TensorDictModule(lambda x: x * 2, [("agent", "obs")], [("agent", "out", "y")])
        td = TensorDict({"agent": {"obs": torch.ones(4, 3)}}, batch_size=[4])
        m(td)
        torch.testing.assert_close(td["agent", "out", "y"], torch.full((4, 3), 2.0))
        assert m.in_keys == [("agent", "obs")]
        assert m(agent_obs=torch.ones(2)).tolist() == [2.0, 2.0]  # nested keyword name

    def test_key_normalisation(self):
        m = TensorDictModule(lambda x: x, ("a",), "b")
        assert m.in_keys == ["a"] and m.out_keys == ["b"]
        m = TensorDictModule(lambda x: x, [("a", ("b", "c"))], ["d"])
        assert m.in_keys == [("a", "b", "c")]
        with pytest.raises(TypeError, match="not a valid key"):
            TensorDictModule(lambda x: x, [1], ["d"])
        with pytest.raises(ValueError, match="duplicates"):
            TensorDictModule(lambda x: (x, x), ["a"], ["b", "b"])

    def test_multiple_outputs_and_discard(self):
        m = TensorDictModule(lambda x: (x + 1, x + 2, x + 3), ["x"], ["a", "_", "c"])
        td = m(TensorDict(x=torch.zeros(2), batch_size=[2]))
        assert set(td.keys()) == {"x", "a", "c"}
        assert td["c"].tolist() == [3.0, 3.0]
        assert m(x=torch.zeros(1)) == (torch.ones(1), torch.full((1,), 3.0))

    @pytest.mark.parametrize(
        "fn, out_keys, n_got",
        [
            (lambda x: (x, x), ["a", "b", "c"], 2),
            (lambda x: x, ["a", "b"], 1),
            (lambda x: (x, x), ["a"], 2),
        ],
    )
    def test_output_count_mismatch(self, fn, out_keys, n_got):
        m = TensorDictModule(fn, ["x"], out_keys)
        td = TensorDict(x=torch.zeros(3), batch_size=[3])
        with pytest.raises(RuntimeError, match=f"returned {n_got} value.*{len(out_keys)} out_keys"):
            m(td)
        assert list(td.keys()) == ["x"]
        with pytest.raises(RuntimeError, match="out_keys"):
            m(x=torch.zeros(3))

    def test_failed_write_rolls_back(self):
        # the second output has the wrong batch size: the first must not stay written
        m = TensorDictModule(lambda x: (x + 1, torch.zeros(7)), ["x"], ["a", ("n", "b")])
        td = TensorDict(x=torch.zeros(3), a=torch.full((3,), 5.0), batch_size=[3])
        a = td["a"]
        with pytest.raises(ValueError, match="batch"):
            m(td)
        assert set(td.keys()) == {"x", "a"} and td["a"] is a
        m2 = TensorDictModule(lambda x: (x + 1, torch.zeros(7)), ["x"], ["new", ("n", "b")])
        with pytest.raises(ValueError):
            m2(td)
        assert set(td.keys()) == {"x", "a"}

    def test_module_error_writes_nothing(self):
        def boom(x):
            raise RuntimeError("boom")

        td = TensorDict(x=torch.zeros(3), batch_size=[3])
        with pytest.raises(RuntimeError, match="boom"):
            TensorDictModule(boom, ["x"], ["y"])(td)
        assert list(td.keys()) == ["x"]

    def test_dict_in_keys_td_key_to_kwarg(self):
        def f(a, b):
            return a - b

        m = TensorDictModule(f, {"x": "a", ("n", "z"): "b"}, ["d"])
        assert m.in_keys == ["x", ("n", "z")]
        td = TensorDict({"x": torch.full((2,), 5.0), "n": {"z": torch.ones(2)}}, batch_size=[2])
        assert m(td)["d"].tolist() == [4.0, 4.0]

    def test_dict_in_keys_direction(self):
        def f(a, b):
            return a - b

        td = TensorDict(x=torch.full((2,), 5.0), z=torch.ones(2), batch_size=[2])
        # {argument: td_key}: inferred from the signature, or explicit
        for m in (
            TensorDictModule(f, {"b": "z", "a": "x"}, ["d"]),
            TensorDictModule(f, {"b": "z", "a": "x"}, ["d"], out_to_in_map=True),
        ):
            assert m.in_keys == ["z", "x"]
            assert m(td)["d"].tolist() == [4.0, 4.0]
        # explicit False wins over the signature
        m = TensorDictModule(lambda **kw: kw["z"] - kw["x"], {"a": "x", "b": "z"}, ["d"],
                             out_to_in_map=False)
        assert m.in_keys == ["a", "b"]
        # nn.Module forward signature
        lin = nn.Bilinear(2, 2, 1)
        m = TensorDictModule(lin, {"input2": "y", "input1": "x"}, ["out"])
        assert m.in_keys == ["y", "x"]
        td = TensorDict(x=torch.randn(3, 2), y=torch.randn(3, 2), batch_size=[3])
        torch.testing.assert_close(m(td)["out"], lin(td["x"], td["y"]))

    def test_plain_callable_and_kwargs_passthrough(self):
        m = TensorDictModule(lambda x, scale=1.0: x * scale, ["x"], ["y"])
        td = TensorDict(x=torch.ones(2), batch_size=[2])
        assert m(td, scale=3.0)["y"].tolist() == [3.0, 3.0]
        assert m(x=torch.ones(1), scale=2.0).tolist() == [2.0]
        assert "module" not in dict(m.named_children())
        with pytest.raises(TypeError, match="callable"):
            TensorDictModule(3, ["x"], ["y"])

    def test_inplace_modes(self):
        lin = nn.Linear(3, 2)
        td = TensorDict(x=torch.randn(4, 3), batch_size=[4])
        out = TensorDictModule(lin, ["x"], ["y"], inplace=False)(td)
        assert out is not td and list(out.keys()) == ["y"] and out.batch_size == td.batch_size
        assert "y" not in td
        out = TensorDictModule(lin, ["x"], ["y"], inplace="empty")(td)
        assert out is not td and list(out.keys()) == ["y"]
        with pytest.raises(ValueError, match="inplace"):
            TensorDictModule(lin, ["x"], ["y"], inplace="yes")

    def test_select_out_keys(self):
        m = TensorDictModule(lambda x: (x + 1, x + 2), ["x"], ["a", "b"])
        assert m.select_out_keys("b") is m
        assert m.out_keys == ["b"] and m.out_keys_source == ["a", "b"]
        td = TensorDict(x=torch.zeros(2), a=torch.full((2,), 9.0), batch_size=[2])
        m(td)
        assert td["a"].tolist() == [9.0, 9.0]  # not selected: not written
        assert td["b"].tolist() == [2.0, 2.0]
        assert m(x=torch.zeros(1)).tolist() == [2.0]
        with pytest.raises(KeyError, match="not outputs"):
            m.select_out_keys("zzz")
        m.reset_out_keys()
        assert m.out_keys == ["a", "b"]
        assert len(m(x=torch.zeros(1))) == 2

    def test_keys_can_be_reassigned(self):
        m = TensorDictModule(lambda x: x + 1, ["x"], ["y"])
        m.in_keys = ["z"]
        m.out_keys = [("o", "w")]
        td = m(TensorDict(z=torch.zeros(2), batch_size=[2]))
        assert td["o", "w"].tolist() == [1.0, 1.0]

    def test_module_can_be_replaced(self):
        m = TensorDictModule(nn.Identity(), ["x"], ["y"])
        m.module = nn.Linear(2, 1)
        assert m(TensorDict(x=torch.zeros(3, 2), batch_size=[3]))["y"].shape == (3, 1)

    def test_keyword_call_errors(self):
        m = TensorDictModule(lambda a, b: a + b, ["a", "b"], ["c"])
        with pytest.raises(RuntimeError, match="Duplicated"):
            m(torch.zeros(1), a=torch.zeros(1), b=torch.zeros(1))
        with pytest.raises(TypeError, match="missing the input 'b'"):
            m(a=torch.zeros(1))
        assert m(torch.ones(1), b=torch.ones(1)).tolist() == [2.0]

    def test_parameters_and_state_dict(self):
        lin = nn.Linear(3, 2)
        m = TensorDictModule(lin, ["x"], ["y"])
        assert [n for n, _ in m.named_parameters()] == ["module.weight", "module.bias"]
        m2 = TensorDictModule(nn.Linear(3, 2), ["x"], ["y"])
        m2.load_state_dict(m.state_dict())
        x = torch.randn(2, 3)
        torch.testing.assert_close(m2(x=x), lin(x))

    def test_deepcopy_keeps_working(self):
        import copy

        m = TensorDictModule(nn.Linear(3, 2), ["x"], ["y"])
        m2 = copy.deepcopy(m)
        with torch.no_grad():
            m2.module.weight.zero_()
            m2.module.bias.fill_(1.0)
        assert m2(x=torch.randn(3)).tolist() == [1.0, 1.0]  # the copy calls its own module
        assert m.module.weight.abs().sum() > 0  # the original is independent


# ----------------------------------------------------------------------------- TensorDictSequential
def _add(src, dst, value):
    return TensorDictModule(lambda x: x + value, [src], [dst])


class TestTensorDictSequential:
    def test_keys(self):
        seq = TensorDictSequential(_add("x", "h", 1), _add("h", "y", 1), _add("z", "w", 1),
                                   _add("y", "h", 1))
        assert seq.in_keys == ["x", "z"]
        assert seq.out_keys == ["y", "w", "h"]  # a key written twice takes its last place

    def test_indexing_slicing_len(self):
        mods = [_add("x", "h", 1), _add("h", "y", 2), _add("y", "z", 3)]
        seq = TensorDictSequential(*mods)
        assert len(seq) == 3 and seq[0] is mods[0] and seq[-1] is mods[2]
        tail = seq[1:]
        assert type(tail) is TensorDictSequential and len(tail) == 2
        assert tail.in_keys == ["h"] and tail[0] is mods[1]
        assert list(seq) == mods
        td = tail(TensorDict(h=torch.zeros(2), batch_size=[2]))
        assert td["z"].tolist() == [5.0, 5.0]

    def test_select_subsequence(self):
        seq = TensorDictSequential(_add("x", "h", 1), _add("h", "y", 1), _add("z", "w", 1),
                                   _add("w", "v", 1))
        sub = seq.select_subsequence(out_keys=["y"])
        assert [m.out_keys for m in sub] == [["h"], ["y"]]
        sub = seq.select_subsequence(in_keys=["z"])
        assert [m.out_keys for m in sub] == [["w"], ["v"]] and sub.in_keys == ["z"]
        sub = seq.select_subsequence(in_keys=["h"], out_keys=["y"])
        assert [m.out_keys for m in sub] == [["y"]]
        sub = seq.select_subsequence(in_keys=["x", "z"], out_keys=["v"])
        assert [m.out_keys for m in sub] == [["w"], ["v"]]
        assert len(seq.select_subsequence()) == 4
        with pytest.raises(ValueError, match="no module"):
            seq.select_subsequence(in_keys=["nothing"])
        with pytest.raises(ValueError, match="no module"):
            seq.select_subsequence(in_keys=["z"], out_keys=["y"])

    def test_select_subsequence_nested_prefix(self):
        seq = TensorDictSequential(_add(("agent", "obs"), "h", 1), _add("other", "w", 1))
        sub = seq.select_subsequence(in_keys=["agent"])
        assert len(sub) == 1 and sub.in_keys == [("agent", "obs")]

    def test_partial_tolerant_dense_skips(self):
        seq = TensorDictSequential(_add("x", "y", 1), _add("z", "w", 1), partial_tolerant=True)
        td = seq(TensorDict(x=torch.zeros(2), batch_size=[2]))
        assert set(td.keys()) == {"x", "y"}
        with pytest.raises(KeyError):
            TensorDictSequential(_add("x", "y", 1), _add("z", "w", 1))(
                TensorDict(x=torch.zeros(2), batch_size=[2])
            )

    def test_partial_tolerant_lazy_stack_per_member(self):
        a = TensorDict(x=torch.ones(3), batch_size=[])
        b = TensorDict(z=torch.ones(3), batch_size=[])
        c = TensorDict(x=torch.ones(3), z=torch.ones(3), batch_size=[])
        stack = lazy_stack([a, b, c], 0)
        seq = TensorDictSequential(
            TensorDictModule(lambda x: x * 2, ["x"], ["y"]),
            TensorDictModule(lambda z: z * 3, ["z"], ["w"]),
            partial_tolerant=True,
        )
        out = seq(stack)
        assert out is stack
        assert set(a.keys()) == {"x", "y"} and set(b.keys()) == {"z", "w"}
        assert set(c.keys()) == {"x", "z", "y", "w"}
        assert a["y"].tolist() == [2.0] * 3 and b["w"].tolist() == [3.0] * 3

    def test_selected_out_keys(self):
        seq = TensorDictSequential(_add("x", "h", 1), _add("h", "y", 1), selected_out_keys=["y"])
        assert seq.out_keys == ["y"]
        td = seq(TensorDict(x=torch.zeros(2), batch_size=[2]))
        assert set(td.keys()) == {"x", "y"} and td["y"].tolist() == [2.0, 2.0]
        # an intermediate already in the input stays (with its new value)
        td = seq(TensorDict(x=torch.zeros(2), h=torch.full((2,), 7.0), batch_size=[2]))
        assert set(td.keys()) == {"x", "h", "y"} and td["h"].tolist() == [1.0, 1.0]
        assert seq(x=torch.zeros(1)).tolist() == [2.0]
        seq.reset_out_keys()
        assert seq.out_keys == ["h", "y"]
        td = seq(TensorDict(x=torch.zeros(2), batch_size=[2]))
        assert set(td.keys()) == {"x", "h", "y"}

    def test_select_out_keys_nested_intermediate(self):
        seq = TensorDictSequential(_add("x", ("tmp", "h"), 1), _add(("tmp", "h"), "y", 1))
        seq.select_out_keys("y")
        td = seq(TensorDict(x=torch.zeros(2), batch_size=[2]))
        assert set(td.keys()) == {"x", "y"}  # the empty "tmp" parent went away too
        with pytest.raises(KeyError, match="not outputs"):
            seq.select_out_keys("x")

    def test_failure_rolls_back_earlier_modules(self):
        def boom(h):
            raise ValueError("boom")

        seq = TensorDictSequential(_add("x", "h", 1), _add("x", "x2", 1),
                                   TensorDictModule(boom, ["h"], ["y"]))
        x = torch.zeros(2)
        td = TensorDict(x=x, x2=torch.full((2,), 4.0), batch_size=[2])
        x2 = td["x2"]
        with pytest.raises(ValueError, match="boom"):
            seq(td)
        assert set(td.keys()) == {"x", "x2"} and td["x2"] is x2 and td["x"] is x

    def test_missing_key_names_the_position(self):
        inner = TensorDictSequential(_add("x", "h", 1), _add("q", "y", 1))
        outer = TensorDictSequential(_add("x", "a", 1), inner)
        td = TensorDict(x=torch.zeros(2), batch_size=[2])
        with pytest.raises(KeyError) as info:
            outer(td)
        msg = str(info.value)
        assert "'q'" in msg and "module 1 of TensorDictSequential, module 1 of" in msg
        assert "['a', 'h', 'x']" in msg  # the keys present when the module ran
        assert list(td.keys()) == ["x"]

    def test_module_conversion(self):
        def double(td):
            td["y"] = td["x"] * 2
            return td

        seq = TensorDictSequential(double, _add("y", "z", 1))
        assert isinstance(seq[0], WrapModule)
        assert seq(TensorDict(x=torch.ones(2), batch_size=[2]))["z"].tolist() == [3.0, 3.0]
        with pytest.raises(TypeError, match="plain nn.Module"):
            TensorDictSequential(nn.Linear(2, 2))
        with pytest.raises(TypeError, match="not callable"):
            TensorDictSequential(3)
        assert len(TensorDictSequential([_add("x", "y", 1), _add("y", "z", 1)])) == 2

    def test_kwargs_reach_every_module(self):
        seq = TensorDictSequential(TensorDictModule(lambda x, k=1: x * k, ["x"], ["y"]),
                                   TensorDictModule(lambda y, k=1: y + k, ["y"], ["z"]))
        td = seq(TensorDict(x=torch.ones(2), batch_size=[2]), k=3)
        assert td["z"].tolist() == [6.0, 6.0]
        assert seq(x=torch.ones(1), k=2)[1].tolist() == [4.0]

    def test_parameters_registered(self):
        seq = TensorDictSequential(TensorDictModule(nn.Linear(2, 2), ["x"], ["y"]),
                                   TensorDictModule(nn.Linear(2, 1), ["y"], ["z"]))
        assert len(list(seq.parameters())) == 4
        assert "module.1.module.weight" in seq.state_dict()


# ----------------------------------------------------------------------------- WrapModule, dispatch, base
class TestWrapAndDispatch:
    def test_wrap_module(self):
        def f(td):
            return td.set("y", td["x"] + 1)

        m = WrapModule(f, in_keys=["x"], out_keys=["y"])
        td = TensorDict(x=torch.zeros(3), batch_size=[3])
        assert m(td) is td and td["y"].tolist() == [1.0] * 3
        assert m(x=torch.zeros(1)).tolist() == [1.0]
        new = WrapModule(lambda td: TensorDict(y=td["x"] * 5, batch_size=td.batch_size),
                         inplace=True)
        td2 = TensorDict(x=torch.ones(2), batch_size=[2])
        assert new(td2) is td2 and td2["y"].tolist() == [5.0, 5.0]
        with pytest.raises(TypeError):
            WrapModule(3)

    def test_dispatch_bare_and_with_args(self):
        class M(nn.Module):
            in_keys = ["a", ("n", "b")]
            out_keys = ["c", "d"]

            @dispatch
            def forward(self, tensordict):
                tensordict["c"] = tensordict["a"] + tensordict["n", "b"]
                tensordict["d"] = tensordict["a"] * 0
                return tensordict

        m = M()
        c, d = m(a=torch.ones(2), n_b=torch.ones(2))
        assert c.tolist() == [2.0, 2.0] and d.tolist() == [0.0, 0.0]
        c, _ = m(torch.ones(2), torch.full((2,), 3.0))
        assert c.tolist() == [4.0, 4.0]
        td = m(TensorDict(a=torch.ones(1), n=TensorDict(b=torch.ones(1))))
        assert td["c"].tolist() == [2.0]
        td = m(tensordict=TensorDict(a=torch.ones(1), n=TensorDict(b=torch.ones(1))))
        assert td["c"].tolist() == [2.0]

        class N(nn.Module):
            @dispatch(source=[("x", "y")], dest=["z"], separator="__")
            def forward(self, tensordict):
                return tensordict.set("z", tensordict["x", "y"] - 1)

        assert N()(x__y=torch.ones(1)).tolist() == [0.0]
        with pytest.raises(RuntimeError, match="Duplicated"):
            N()(torch.ones(1), x__y=torch.ones(1))

    def test_dispatch_auto_batch_size(self):
        seen = {}

        @dispatch(source=["a", "b"], dest=["a"])
        def f(tensordict):
            seen["bs"] = tensordict.batch_size
            return tensordict

        f(a=torch.zeros(4, 3, 2), b=torch.zeros(4, 3))
        assert seen["bs"] == torch.Size([4, 3])

        @dispatch(source=["a"], dest=["a"], auto_batch_size=False)
        def g(tensordict):
            seen["bs"] = tensordict.batch_size
            return tensordict

        g(a=torch.zeros(4, 3))
        assert seen["bs"] == torch.Size([])

    def test_base_subclass_is_dispatched(self):
        class Double(TensorDictModuleBase):
            def __init__(self):
                super().__init__()
                self.in_keys, self.out_keys = ["x"], ["y", "z"]

            def forward(self, tensordict):
                tensordict["y"] = tensordict["x"] * 2
                tensordict["z"] = tensordict["x"] * 3
                return tensordict

        m = Double()
        assert [t.tolist() for t in m(x=torch.ones(1))] == [[2.0], [3.0]]
        m.select_out_keys("z")
        td = m(TensorDict(x=torch.ones(2), batch_size=[2]))
        assert set(td.keys()) == {"x", "z"}
        assert m(x=torch.ones(1)).tolist() == [3.0]
        m.reset_out_keys()
        assert m.out_keys == ["y", "z"]
        assert set(m(TensorDict(x=torch.ones(2), batch_size=[2])).keys()) == {"x", "y", "z"}
        seq = TensorDictSequential(m, _add("z", "w", 1))
        assert seq.in_keys == ["x"] and seq(x=torch.ones(1))[-1].tolist() == [4.0]


# ----------------------------------------------------------------------------- interaction type
class TestInteractionType:
    def test_strings_and_aliases(self):
        assert InteractionType("Random") is InteractionType.RANDOM
        assert InteractionType.from_str("MODE") is InteractionType.MODE
        assert ExplorationType is InteractionType
        assert set_exploration_type is set_interaction_type
        assert exploration_type is interaction_type
        with pytest.raises(ValueError, match="not an interaction type"):
            set_interaction_type("sometimes")

    def test_context_nesting_and_restore_on_error(self):
        assert interaction_type() is None
        with set_interaction_type(InteractionType.RANDOM):
            assert interaction_type() is InteractionType.RANDOM
            with set_interaction_type("mode"):
                assert interaction_type() is InteractionType.MODE
                with set_interaction_type(None):
                    assert interaction_type() is None
                assert interaction_type() is InteractionType.MODE
            with pytest.raises(ZeroDivisionError):
                with set_interaction_type(InteractionType.MEAN):
                    1 / 0  # noqa: B018
            assert interaction_type() is InteractionType.RANDOM
        assert interaction_type() is None
        with set_interaction_type():
            assert interaction_type() is InteractionType.DETERMINISTIC

    def test_decorator(self):
        @set_interaction_type(InteractionType.MODE)
        def inner(depth):
            if depth:
                return inner(depth - 1)
            return interaction_type()

        assert inner(3) is InteractionType.MODE
        assert interaction_type() is None

        @set_interaction_type("random")
        def fails():
            raise KeyError("x")

        with pytest.raises(KeyError):
            fails()
        assert interaction_type() is None

    def test_same_object_reentered(self):
        ctx = set_interaction_type("mean")
        with ctx:
            with set_interaction_type("mode"):
                with ctx:
                    assert interaction_type() is InteractionType.MEAN
                assert interaction_type() is InteractionType.MODE
            assert interaction_type() is InteractionType.MEAN
        assert interaction_type() is None

    def test_process_wide_vs_thread_local(self):
        seen = {}

        def probe(name):
            seen[name] = interaction_type()

        with set_interaction_type("random"):
            t = threading.Thread(target=probe, args=("process",))
            t.start()
            t.join()
        with set_interaction_type("mode", thread_local=True):
            assert interaction_type() is InteractionType.MODE
            with set_interaction_type("random"):  # process-wide: the thread value still wins here
                assert interaction_type() is InteractionType.MODE
                t = threading.Thread(target=probe, args=("thread",))
                t.start()
                t.join()
        assert seen == {"process": InteractionType.RANDOM, "thread": InteractionType.RANDOM}
        assert interaction_type() is None

    def test_modules_are_not_mutated(self):
        module, _ = build("probabilistic")
        before = module[-1].default_interaction_type
        with set_interaction_type("random"):
            module(make_td((2,)))
        assert module[-1].default_interaction_type is before


# ----------------------------------------------------------------------------- mappings
class TestNormalParamExtractor:
    def test_split_and_default_mapping(self):
        loc, scale = NormalParamExtractor()(torch.zeros(5, 6))
        assert loc.shape == scale.shape == (5, 3)
        torch.testing.assert_close(scale, torch.ones(5, 3))
        x = torch.randn(7, 4) * 50
        loc, scale = NormalParamExtractor()(x)
        torch.testing.assert_close(loc, x[:, :2])
        assert (scale > 0).all()

    @pytest.mark.parametrize(
        "name, at_zero",
        [("biased_softplus_1.0", 1.0), ("biased_softplus_2.5", 2.5), ("biased_softplus", 1.0),
         ("biased_softplus_2.0_0.5", 2.0), ("softplus", 0.6931), ("exp", 1.0), ("relu", 0.0),
         ("none", 0.0), ("identity", 0.0), ("expln", 1.0)],
    )
    def test_mappings_value_at_zero(self, name, at_zero):
        torch.testing.assert_close(mappings(name)(torch.zeros(3)), torch.full((3,), at_zero),
                                   atol=1e-4, rtol=0)

    def test_lower_bounds(self):
        very_negative = torch.full((2, 4), -1e3)
        _, scale = NormalParamExtractor("biased_softplus_2.0_0.5")(very_negative)
        torch.testing.assert_close(scale, torch.full((2, 2), 0.5))
        _, scale = NormalParamExtractor("relu", scale_lb=0.1)(very_negative)
        torch.testing.assert_close(scale, torch.full((2, 2), 0.1))
        _, scale = NormalParamExtractor("exp")(very_negative)
        assert (scale >= 1e-4).all()

    def test_callable_and_errors(self):
        _, scale = NormalParamExtractor(lambda s: s.abs() + 3)(torch.zeros(1, 2))
        assert scale.tolist() == [[3.0]]
        with pytest.raises(ValueError, match="unknown scale mapping"):
            NormalParamExtractor("sqrt")
        with pytest.raises(ValueError, match="greater than the minimum"):
            biased_softplus(0.1, min_val=0.5)

    def test_gradient_flows(self):
        x = torch.zeros(3, 4, requires_grad=True)
        loc, scale = NormalParamExtractor()(x)
        (loc.sum() + scale.sum()).backward()
        assert (x.grad != 0).all()
