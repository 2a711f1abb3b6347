"""Game solvers against plain Python references: tic-tac-toe minimax over every reachable
position, connect-four depth-limited search against a textbook alpha-beta."""

from __future__ import annotations

import functools

import pytest
import torch

from steersman.envs import ConnectFourEnv, TicTacToeEnv
from steersman.envs.native._board import board_lines
from steersman.planning import AlphaBetaPlayer, MinimaxPlayer, TicTacToeSolver
from steersman.planning.solvers import (
    WIN_SCORE,
    connect_four_heuristic,
    games_against_minimax,
    negamax_connect_four,
)
from steersman.tensordict import TensorDict

TTT_LINES = [tuple(x) for x in board_lines(3, 3, 3).tolist()]


def _winner(board: tuple) -> int:
    for a, b, c in TTT_LINES:
        if board[a] != 0 and board[a] == board[b] == board[c]:
            return board[a]
    return 0


@functools.cache
def _ref_value(board: tuple) -> int:
    """Plain recursive minimax: value for the player to move."""
    sign = 1 if board.count(1) == board.count(-1) else -1
    if _winner(board) != 0:
        return -1  # the previous mover made a line
    if 0 not in board:
        return 0
    return max(-_ref_value(board[:i] + (sign,) + board[i + 1:]) for i in range(9) if board[i] == 0)


def _ref_reachable() -> set:
    seen, todo = {(0,) * 9}, [(0,) * 9]
    while todo:
        b = todo.pop()
        if _winner(b) or 0 not in b:
            continue
        sign = 1 if b.count(1) == b.count(-1) else -1
        for i in range(9):
            if b[i] == 0:
                c = b[:i] + (sign,) + b[i + 1:]
                if c not in seen:
                    seen.add(c)
                    todo.append(c)
    return seen


def test_tictactoe_solver_matches_plain_minimax_on_every_reachable_position():
    solver = TicTacToeSolver()
    positions = solver.positions()
    ref = _ref_reachable()
    assert len(ref) == 5478
    assert {tuple(p) for p in positions.tolist()} == ref
    values = solver.value(positions).tolist()
    qvalues = solver.qvalues(positions).tolist()
    terminals = solver.terminal(positions).tolist()
    for board, v, q, t in zip(map(tuple, positions.tolist()), values, qvalues, terminals):
        assert v == _ref_value(board), board
        terminal = _winner(board) != 0 or 0 not in board
        assert t == terminal
        sign = 1 if board.count(1) == board.count(-1) else -1
        for i in range(9):
            if board[i] != 0 or terminal:
                assert q[i] == float("-inf")
            else:
                assert q[i] == -_ref_value(board[:i] + (sign,) + board[i + 1:])
    assert solver.positions(include_terminal=False).shape[0] == 4520
    # [B, 3, 3] boards (the env's "board" entry) give the same values
    assert torch.equal(solver.value(positions.view(-1, 3, 3)), solver.value(positions))


def test_tictactoe_solver_refuses_bad_shapes():
    with pytest.raises(ValueError, match=r"boards must be \[..., 9\] or \[..., 3, 3\], got \[2, 8\]"):
        TicTacToeSolver().value(torch.zeros(2, 8, dtype=torch.int8))


def _play(env, first, second, games: int) -> torch.Tensor:
    """Outcomes [games] for the first player (+1 win, 0 draw, -1 loss)."""
    td = env.reset()
    outcome = torch.zeros(games)
    done = torch.zeros(games, dtype=torch.bool)
    while not bool(done.all()):
        player = td["current_player"].clone()
        a_first = first(td.clone())["action"]
        a_second = second(td.clone())["action"]
        action = torch.where(player == 0, a_first, a_second)
        assert bool(td["action_mask"][torch.arange(games), action][~done].all()), "an illegal move"
        td["action"] = action
        nxt = env.step(td)["next"]
        won = nxt["reward"].squeeze(-1) > 0
        outcome = torch.where(won & ~done, torch.where(player == 0, 1.0, -1.0), outcome)
        done = done | nxt["terminated"].squeeze(-1)
        td = nxt
    return outcome


def _random_player(seed: int):
    g = torch.Generator().manual_seed(seed)

    def act(td):
        u = torch.rand(td["action_mask"].shape, generator=g).masked_fill(~td["action_mask"], -1.0)
        td["action"] = u.argmax(-1)
        return td

    return act


def test_minimax_player_never_loses_and_draws_itself():
    n = 200
    env = TicTacToeEnv(batch_size=[n])
    mm = MinimaxPlayer(torch.Generator().manual_seed(0))
    assert bool((_play(env, mm, _random_player(1), n) >= 0).all())
    as_second = _play(env, _random_player(2), mm, n)
    assert bool((as_second <= 0).all())
    assert float((as_second < 0).float().mean()) > 0.5  # it also wins most games against random
    assert bool((_play(env, mm, MinimaxPlayer(torch.Generator().manual_seed(3)), n) == 0).all())


# ---------------------------------------------------------------- connect four
C4_LINES = [tuple(x) for x in board_lines(6, 7, 4).tolist()]


def _ref_heuristic(board: list, sign: int) -> float:
    score = 0.0
    for line in C4_LINES:
        cells = [board[i] for i in line]
        own, opp = cells.count(sign), cells.count(-sign)
        score += {2: 2.0, 3: 5.0}.get(own, 0.0) * (opp == 0) - {2: 2.0, 3: 5.0}.get(opp, 0.0) * (own == 0)
    return score + 3.0 * sum(board[r * 7 + 3] == sign for r in range(6))


def _ref_move(board: list, col: int, sign: int) -> list | None:
    for r in range(6):
        if board[r * 7 + col] == 0:
            out = list(board)
            out[r * 7 + col] = sign
            return out
    return None


def _ref_alphabeta(board: list, sign: int, depth: int, alpha: float, beta: float) -> float:
    """Textbook negamax alpha-beta with the same scoring: value for ``sign`` to move."""
    best = float("-inf")
    for col in range(7):
        child = _ref_move(board, col, sign)
        if child is None:
            continue
        if any(all(child[i] == sign for i in line) for line in C4_LINES):
            v = WIN_SCORE + depth
        elif 0 not in child:
            v = 0.0
        elif depth == 1:
            v = -_ref_heuristic(child, -sign)
        else:
            v = -_ref_alphabeta(child, -sign, depth - 1, -beta, -alpha)
        best = max(best, v)
        alpha = max(alpha, v)
        if alpha >= beta:
            break
    return best


def _random_c4_positions(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Unfinished positions after 4-20 random moves."""
    g = torch.Generator().manual_seed(seed)
    env = ConnectFourEnv(batch_size=[1])
    boards, players = [], []
    while len(boards) < n:
        td = env.reset()
        for _ in range(int(torch.randint(4, 21, (1,), generator=g))):
            u = torch.rand(7, generator=g).masked_fill(~td["action_mask"][0], -1.0)
            td["action"] = u.argmax().view(1)
            td = env.step(td)["next"]
            if bool(td["terminated"].any()):
                break
        if not bool(td["terminated"].any()):
            boards.append(td["board"].flatten(-2))
            players.append(td["current_player"])
    return torch.cat(boards), torch.cat(players)


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_connect_four_search_equals_plain_alphabeta(depth):
    boards, players = _random_c4_positions(12, seed=depth)
    q = negamax_connect_four(boards, players, depth)
    for i in range(boards.shape[0]):
        b, sign = boards[i].tolist(), 1 - 2 * int(players[i])
        assert float(q[i].max()) == _ref_alphabeta(b, sign, depth, float("-inf"), float("inf"))
        assert float(connect_four_heuristic(boards[i:i + 1], players[i:i + 1])) == _ref_heuristic(b, sign)
        full = [b[35 + c] != 0 for c in range(7)]
        assert [bool(torch.isinf(x) and x < 0) for x in q[i]] == full


def test_alphabeta_player_wins_blocks_and_beats_random():
    # first player threatens column 0 (three stacked); second player to move must block
    board = torch.zeros(2, 42, dtype=torch.int8)
    board[:, [0, 7, 14]] = 1
    board[:, [6, 13]] = -1
    board[1, 20] = -1  # board 1: the second player (to move) also has three in column 6: winning beats blocking
    td = TensorDict({"board": board.view(2, 6, 7), "current_player": torch.tensor([1, 1])}, [2])
    assert AlphaBetaPlayer(depth=2)(td)["action"].tolist() == [0, 6]  # block; win at once
    n = 16
    env = ConnectFourEnv(batch_size=[n])
    outcome = _play(env, AlphaBetaPlayer(depth=2, generator=torch.Generator().manual_seed(0)), _random_player(0), n)
    assert float((outcome > 0).float().mean()) >= 0.9
    with pytest.raises(ValueError, match="depth must be an int >= 1, got 0"):
        AlphaBetaPlayer(depth=0)


def _ref_games(agent_move, seat: int) -> dict:
    """Plain recursion: the distinct final boards of a deterministic agent in ``seat``
    against every optimal move of the opponent, by outcome for the agent."""
    finals: dict[tuple, int] = {}

    def play(board: tuple) -> None:
        sign = 1 if board.count(1) == board.count(-1) else -1
        mover = 0 if sign == 1 else 1
        w = _winner(board)
        if w != 0 or 0 not in board:
            agent_sign = 1 if seat == 0 else -1
            finals[board] = 0 if w == 0 else (1 if w == agent_sign else -1)
            return
        if mover == seat:
            moves = [agent_move(board)]
        else:
            qs = {i: -_ref_value(board[:i] + (sign,) + board[i + 1:]) for i in range(9) if board[i] == 0}
            moves = [i for i, q in qs.items() if q == max(qs.values())]
        for i in moves:
            play(board[:i] + (sign,) + board[i + 1:])

    play((0,) * 9)
    return {name: sum(1 for v in finals.values() if v == val) for name, val in (("win", 1), ("draw", 0),
                                                                                ("loss", -1))}


@pytest.mark.parametrize("agent", ["first_free", "last_free", "perfect", "hashed"])
def test_games_against_minimax_match_a_plain_recursion(agent):
    """Every line a minimax opponent can choose (all its optimal moves), against agents
    that lose, draw or win, equals a plain recursive enumeration of the final boards."""
    solver = TicTacToeSolver()

    def move(board: tuple) -> int:
        free = [i for i in range(9) if board[i] == 0]
        if agent == "first_free":
            return free[0]
        if agent == "last_free":
            return free[-1]
        if agent == "hashed":
            return free[hash(board) % len(free)]
        q = solver.qvalues(torch.tensor([board], dtype=torch.int8))[0]
        return int(q.argmax())

    def batched(board: torch.Tensor, player: torch.Tensor) -> torch.Tensor:
        assert bool((((board != 0).sum(-1) % 2) == player).all())  # the player to move is passed right
        return torch.tensor([move(tuple(b)) for b in board.tolist()])

    out = games_against_minimax(batched)
    ref = [_ref_games(move, seat) for seat in (0, 1)]
    for name in ("win", "draw", "loss"):
        assert int(out[name]) == ref[0][name] + ref[1][name], name
    assert out["lost_boards"].shape == (int(out["loss"]), 9)
    if agent == "perfect":
        assert int(out["loss"]) == 0 and int(out["win"]) == 0
    if agent == "first_free":
        assert int(out["loss"]) > 0
    one_seat = games_against_minimax(batched, sides=(1,))
    assert int(one_seat["loss"]) == ref[1]["loss"]


def test_games_against_minimax_rejects_an_illegal_agent_move():
    with pytest.raises(ValueError, match="occupied cell"):
        games_against_minimax(lambda board, player: torch.zeros(board.shape[0], dtype=torch.int64))
    with pytest.raises(ValueError, match=r"agent must return actions \[1\] in 0..8"):
        games_against_minimax(lambda board, player: torch.full((board.shape[0],), 9), sides=(0,))
