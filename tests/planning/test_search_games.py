"""Search on tic-tac-toe with the game itself as the model, against the exact solver.

The model is uninformative (uniform prior, value 0): the search only sees the rules and
the wins. What is covered, and why not more:

* positions with at least 5 pieces where one move is strictly best (a seeded sample of
  400 of the 1978; all of them pass too, in about 10x the time): the chosen move is that
  move, for Gumbel MuZero and for MuZero;
* positions with 5 or 6 pieces (a seeded sample of 200 of the 1140 with the second player
  to move and 200 of the 1372 with the first), played to the end against minimax: the
  searching side never does worse than the position's minimax value (it never loses a
  game that is not lost), on either side.

Positions with fewer pieces need far more simulations with an uninformative model (at
256 simulations MuZero still misses the unique best move in 11 of the 428 such
positions: a mean backup only approaches minimax as visits concentrate), so they are
left to the learned AlphaZero agent (``tests/recipes/test_alphazero.py``).
"""

from __future__ import annotations

import functools

import pytest
import torch

from steersman.envs import TicTacToeEnv
from steersman.planning import (
    MinimaxPlayer,
    TicTacToeSolver,
    gumbel_muzero_policy,
    muzero_policy,
    qtransform_by_min_max,
    recurrent_fn_from_env,
    root_from_env,
)
from steersman.tensordict import TensorDict

SIMULATIONS = 128
POLICIES = {
    "gumbel": functools.partial(gumbel_muzero_policy, gumbel_scale=0.0),
    # Q normalised by the game's value bounds (mctx's default normalisation by the node's
    # siblings inflates tiny differences between near-zero means into [0, 1])
    "muzero": functools.partial(muzero_policy, dirichlet_fraction=0.0, temperature=0.0,
                                qtransform=functools.partial(qtransform_by_min_max, min_value=-1.0, max_value=1.0)),
}


def _player(boards: torch.Tensor) -> torch.Tensor:
    return ((boards == 1).sum(-1) != (boards == -1).sum(-1)).long()


def _sample(positions: torch.Tensor, k: int, seed: int) -> torch.Tensor:
    return positions[torch.randperm(positions.shape[0], generator=torch.Generator().manual_seed(seed))[:k]]


def _search(policy: str, boards: torch.Tensor, seed: int = 0) -> torch.Tensor:
    env = TicTacToeEnv(batch_size=[boards.shape[0]])
    env.set_state({"board": boards, "current_player": _player(boards)})
    out = POLICIES[policy](None, torch.Generator().manual_seed(seed), root_from_env(env), recurrent_fn_from_env(env),
                           SIMULATIONS, invalid_actions=boards != 0, max_depth=9)
    return out.action


@pytest.fixture(scope="module")
def solver() -> TicTacToeSolver:
    return TicTacToeSolver()


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_search_picks_the_strictly_best_move(policy, solver):
    positions = solver.positions(include_terminal=False)
    positions = positions[(positions != 0).sum(-1) >= 5]
    q = solver.qvalues(positions)
    best = q.amax(-1, keepdim=True)
    unique = (q == best).sum(-1) == 1
    positions, q, best = positions[unique], q[unique], best[unique].squeeze(-1)
    assert positions.shape[0] == 1978
    keep = torch.randperm(1978, generator=torch.Generator().manual_seed(0))[:400]
    positions, q, best = positions[keep], q[keep], best[keep]
    action = _search(policy, positions)
    wrong = q.gather(-1, action.unsqueeze(-1)).squeeze(-1) != best
    assert not bool(wrong.any()), positions[wrong][:3].view(-1, 3, 3)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_search_never_loses_a_game_that_is_not_lost_against_minimax(policy, solver):
    positions = solver.positions(include_terminal=False)
    pieces = (positions != 0).sum(-1)
    assert int((pieces == 5).sum()) == 1140 and int((pieces == 6).sum()) == 1372
    positions = torch.cat([_sample(positions[pieces == 5], 200, 1), _sample(positions[pieces == 6], 200, 2)])
    start_value = solver.value(positions)
    n = positions.shape[0]
    env = TicTacToeEnv(batch_size=[n])
    env.set_state({"board": positions, "current_player": _player(positions)})
    searcher = _player(positions)  # the side to move at the start searches
    minimax = MinimaxPlayer(torch.Generator().manual_seed(0))
    outcome = torch.zeros(n)
    done = torch.zeros(n, dtype=torch.bool)
    td = env.reset(TensorDict({"_reset": torch.zeros(n, dtype=torch.bool)}, [n]))  # the entries of the set state
    while not bool(done.all()):
        board = env.get_state()["board"]
        player = td["current_player"].clone()
        action = minimax(td.clone())["action"]
        turn = (player == searcher) & ~done  # search only where the searching side is to move
        if bool(turn.any()):
            action[turn] = _search(policy, board[turn])
        assert bool(td["action_mask"].gather(-1, action.unsqueeze(-1)).squeeze(-1)[~done].all())
        nxt = env.step(td.set("action", action))["next"]
        won = (nxt["reward"].squeeze(-1) > 0) & ~done
        outcome = torch.where(won, torch.where(player == searcher, 1.0, -1.0), outcome)
        done = done | nxt["terminated"].squeeze(-1)
        td = nxt
    assert bool((outcome >= start_value).all()), positions[outcome < start_value][:3].view(-1, 3, 3)
    assert bool((searcher == 0).any() and (searcher == 1).any())
