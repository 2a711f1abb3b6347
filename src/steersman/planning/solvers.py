"""Exact and depth-limited game solvers, and players built on them (opponents for evaluation).

* Tic-tac-toe is solved exactly: every board is a base-3 code (``3**9 = 19683`` codes),
  and the minimax value of all of them is computed at once, as tensors, by nine rounds
  of ``V(s) = max_a -V(child(s, a))`` (a game lasts at most nine moves).
  :class:`TicTacToeSolver` holds the tables; :class:`MinimaxPlayer` plays an optimal move.
* Connect four is searched to a fixed depth with a window-counting heuristic at the
  leaves (:class:`AlphaBetaPlayer`). It returns the depth-limited minimax value that
  alpha-beta computes; instead of pruning one board at a time in Python, it evaluates
  every leaf of the ``B`` boards as one batch of tensors (``B * 7**depth`` boards).

Values are from the point of view of the player to move: +1 a forced win, -1 a forced
loss, 0 a draw with best play. Boards are the envs' int8 ``[B, rows * cols]`` (or
``[B, rows, cols]``) tensors: 1 the first player, -1 the second, 0 empty.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import Tensor

from steersman.envs.native._board import board_lines
from steersman.envs.native.connect_four import ConnectFourEnv
from steersman.tensordict import TensorDictBase

__all__ = ["AlphaBetaPlayer", "MinimaxPlayer", "TicTacToeSolver", "connect_four_heuristic", "games_against_minimax",
           "negamax_connect_four"]

_CELLS = 9
_POW3 = 3 ** torch.arange(_CELLS)  # digit i of a code is cell i: 0 empty, 1 first player, 2 second player


def _decode(codes: Tensor) -> Tensor:
    """Boards int8 ``[N, 9]`` (1, -1, 0) of base-3 codes ``[N]``."""
    digits = (codes.unsqueeze(-1) // _POW3) % 3
    return torch.where(digits == 2, -1, digits).to(torch.int8)


def _encode(board: Tensor) -> Tensor:
    """Base-3 codes ``[*b]`` of boards ``[*b, 9]``."""
    b = board.to(torch.int64)
    return (torch.where(b < 0, 2, b) * _POW3.to(board.device)).sum(-1)


@functools.cache
def _tables() -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(values [C], qvalues [C, 9], reachable [C], terminal [C])`` for every code ``C = 3**9``."""
    codes = torch.arange(3 ** _CELLS)
    boards = _decode(codes)
    n_first, n_second = (boards == 1).sum(-1), (boards == -1).sum(-1)
    player_sign = torch.where(n_first == n_second, 1, -1).to(torch.int8)  # the player to move
    lines = board_lines(3, 3, 3)
    held = boards[:, lines]  # [C, 8, 3]
    first_line = (held == 1).all(-1).any(-1)
    second_line = (held == -1).all(-1).any(-1)
    last_mover_won = torch.where(player_sign == 1, second_line, first_line)
    terminal = first_line | second_line | (boards != 0).all(-1)
    empty = boards == 0
    digit = torch.where(player_sign == 1, 1, 2).unsqueeze(-1)
    children = torch.where(empty & ~terminal.unsqueeze(-1), codes.unsqueeze(-1) + digit * _POW3, -1)  # [C, 9]
    legal = children >= 0
    values = torch.where(last_mover_won, -1.0, 0.0)
    for _ in range(_CELLS):  # a position's value depends on positions with one more piece
        q = torch.where(legal, 0.0 - values[children.clamp_min(0)], float("-inf"))
        values = torch.where(terminal, values, q.amax(-1))
    qvalues = torch.where(legal, 0.0 - values[children.clamp_min(0)], float("-inf"))
    reachable = torch.zeros(3 ** _CELLS, dtype=torch.bool)
    reachable[0] = True
    for _ in range(_CELLS):  # positions reached by legal moves from the empty board
        reachable[children[reachable & ~terminal][legal[reachable & ~terminal]]] = True
    return values, qvalues, reachable, terminal


class TicTacToeSolver:
    """Exact minimax values of every tic-tac-toe position (computed once per process, ~10 ms).

    ``value(board) -> [B]`` and ``qvalues(board) -> [B, 9]`` (``-inf`` at occupied cells;
    the value of a move is the value, for the mover, of the position it leads to) are from
    the point of view of the player to move, who is deduced from the piece counts.
    :meth:`positions` lists the 5478 reachable positions (4520 not finished).

    Example:
        >>> import torch
        >>> from steersman.planning import TicTacToeSolver
        >>> solver = TicTacToeSolver()
        >>> solver.value(torch.zeros(1, 9, dtype=torch.int8)).tolist()   # a draw with best play
        [0.0]
        >>> board = torch.tensor([[1, 1, 0, -1, -1, 0, 0, 0, 0]], dtype=torch.int8)  # first player to move
        >>> solver.qvalues(board)[0].tolist()[:3]
        [-inf, -inf, 1.0]
        >>> solver.positions().shape, solver.positions(include_terminal=False).shape
        (torch.Size([5478, 9]), torch.Size([4520, 9]))
    """

    def __init__(self) -> None:
        self._values, self._qvalues, self._reachable, self._terminal = _tables()

    @staticmethod
    def _flat(board: Tensor) -> Tensor:
        board = torch.as_tensor(board)
        if board.shape[-2:] == (3, 3):
            board = board.flatten(-2)
        if board.shape[-1] != _CELLS:
            raise ValueError(f"TicTacToeSolver: boards must be [..., 9] or [..., 3, 3], got {list(board.shape)}")
        return board

    def value(self, board: Tensor) -> Tensor:
        """Minimax value ``[*b]`` for the player to move (terminal boards: -1 lost, 0 drawn)."""
        board = self._flat(board)
        return self._values.to(board.device)[_encode(board)]

    def qvalues(self, board: Tensor) -> Tensor:
        """Minimax value of each move ``[*b, 9]`` for the player to move; ``-inf`` where illegal."""
        board = self._flat(board)
        return self._qvalues.to(board.device)[_encode(board)]

    def terminal(self, board: Tensor) -> Tensor:
        """Whether the game is over (a line or a full board) ``[*b]``."""
        board = self._flat(board)
        return self._terminal.to(board.device)[_encode(board)]

    def positions(self, include_terminal: bool = True) -> Tensor:
        """Every position reachable from the empty board, int8 ``[N, 9]`` (code order)."""
        keep = self._reachable if include_terminal else self._reachable & ~self._terminal
        return _decode(keep.nonzero().squeeze(-1))


def _pick(scores: Tensor, generator: torch.Generator | None, preference: Tensor | None = None) -> Tensor:
    """The argmax of ``scores [B, A]``; ties broken uniformly with ``generator`` (given) or by
    ``preference [A]`` (higher first; None: the lowest index)."""
    best = scores == scores.amax(-1, keepdim=True)
    if generator is not None:
        noise = torch.rand(scores.shape, generator=generator, device=scores.device)
    elif preference is not None:
        noise = preference.to(scores.device).expand_as(scores).to(torch.float32)
    else:
        noise = -torch.arange(scores.shape[-1], device=scores.device, dtype=torch.float32).expand_as(scores)
    return torch.where(best, noise, float("-inf")).argmax(-1)


class MinimaxPlayer:
    """A perfect tic-tac-toe player: reads ``"board"`` (``[B, 3, 3]`` or ``[B, 9]``) from a
    TensorDict and writes an optimal ``"action"`` ``[B]``. Ties between optimal moves are
    broken uniformly at random with ``generator`` (a ``torch.Generator``; None: the lowest
    cell). Finished boards get action 0.

    Example:
        >>> import torch
        >>> from steersman.envs import TicTacToeEnv
        >>> from steersman.planning import MinimaxPlayer
        >>> env = TicTacToeEnv(batch_size=[2])
        >>> td = env.reset()
        >>> MinimaxPlayer()(td)["action"].shape
        torch.Size([2])
    """

    def __init__(self, generator: torch.Generator | None = None) -> None:
        self.solver = TicTacToeSolver()
        self.generator = generator

    def __call__(self, tensordict: TensorDictBase) -> TensorDictBase:
        q = self.solver.qvalues(tensordict.get("board"))
        finished = torch.isinf(q).all(-1, keepdim=True)
        action = _pick(torch.where(finished, 0.0, q), self.generator)
        tensordict.set("action", torch.where(finished.squeeze(-1), 0, action))
        return tensordict


def games_against_minimax(agent: Callable[[Tensor, Tensor], Tensor], sides: tuple[int, ...] = (0, 1)
                          ) -> dict[str, Tensor]:
    """Every tic-tac-toe game a deterministic ``agent`` can play against *every* minimax
    player: the opponent branches into all of its optimal moves (each tie-break a perfect
    player could make), the agent plays its one move. ``agent(board int8 [n, 9], player
    int64 [n]) -> action [n]`` is called on batches of unfinished boards where it is to
    move; ``sides`` are the agent's seats (0: it moves first, 1: second). Transpositions
    are merged, so the results count distinct final boards per seat.

    Returns ``{"win", "draw", "loss"}``: the number of distinct final boards of each
    outcome for the agent, and ``"lost_boards"`` int8 ``[L, 9]`` (the lost final boards).
    The agent never loses against a minimax player iff ``loss == 0``.

    Example:
        >>> import torch
        >>> from steersman.planning import TicTacToeSolver
        >>> from steersman.planning.solvers import games_against_minimax
        >>> solver = TicTacToeSolver()
        >>> perfect = lambda board, player: solver.qvalues(board).argmax(-1)
        >>> out = games_against_minimax(perfect)
        >>> int(out["loss"]), int(out["win"]), int(out["draw"]) > 0
        (0, 0, True)
        >>> int(games_against_minimax(lambda b, p: (b == 0).int().argmax(-1))["loss"]) > 0  # first free cell
        True
    """
    solver = TicTacToeSolver()
    board = torch.zeros(len(sides), _CELLS, dtype=torch.int8)
    seat = torch.tensor(sides, dtype=torch.int64)
    counts = {"win": 0, "draw": 0, "loss": 0}
    lost = []
    for ply in range(_CELLS + 1):
        if board.shape[0] == 0:
            break
        to_move = ply % 2  # every board of the frontier has ``ply`` pieces
        over = solver.terminal(board)
        if bool(over.any()):
            last_won = solver.value(board[over]) < 0  # the player to move lost: the last mover made a line
            agent_moved_last = seat[over] != to_move
            outcome = torch.where(last_won, torch.where(agent_moved_last, 1, -1), 0)
            for name, v in (("win", 1), ("draw", 0), ("loss", -1)):
                counts[name] += int((outcome == v).sum())
            lost.append(board[over][outcome < 0])
            board, seat = board[~over], seat[~over]
        mine = seat == to_move
        sign = 1 if to_move == 0 else -1
        children, child_seat = [], []
        if bool(mine.any()):
            b = board[mine]
            action = torch.as_tensor(agent(b.clone(), torch.full((b.shape[0],), to_move))).to(torch.int64)
            if action.shape != (b.shape[0],) or bool(((action < 0) | (action >= _CELLS)).any()):
                raise ValueError(f"games_against_minimax: agent must return actions [{b.shape[0]}] in 0..8, got "
                                 f"{list(action.shape)} {action.tolist()[:8]}")
            if not bool((b.gather(-1, action.unsqueeze(-1)) == 0).all()):
                raise ValueError("games_against_minimax: the agent played on an occupied cell")
            children.append(b.scatter(-1, action.unsqueeze(-1), torch.full_like(b[:, :1], sign)))
            child_seat.append(seat[mine])
        if bool((~mine).any()):
            b = board[~mine]
            q = solver.qvalues(b)
            row, cell = (q == q.amax(-1, keepdim=True)).nonzero(as_tuple=True)  # every optimal move
            children.append(b[row].scatter(-1, cell.unsqueeze(-1), torch.full_like(row, sign, dtype=torch.int8
                                                                                   ).unsqueeze(-1)))
            child_seat.append(seat[~mine][row])
        if not children:
            break
        board, seat = torch.cat(children), torch.cat(child_seat)
        key = torch.unique(_encode(board) * 2 + seat, return_inverse=True)[1]  # merge transpositions
        first = torch.full((int(key.max()) + 1,), board.shape[0], dtype=torch.int64).scatter_reduce(
            0, key, torch.arange(board.shape[0]), "amin")
        board, seat = board[first], seat[first]
    return {"win": torch.tensor(counts["win"]), "draw": torch.tensor(counts["draw"]),
            "loss": torch.tensor(counts["loss"]),
            "lost_boards": torch.cat(lost) if lost else torch.zeros(0, _CELLS, dtype=torch.int8)}


# ---------------------------------------------------------------- connect four
_C4 = ConnectFourEnv  # rows, cols, the move rule (class attributes and methods)
_C4_LINES = board_lines(_C4.rows, _C4.cols, _C4.win_length)
_CENTER_FIRST = torch.tensor([0.0, 1.0, 2.0, 3.0, 2.0, 1.0, 0.0])  # tie preference: central columns
#: a won position scores this (plus the remaining depth: sooner wins score higher)
WIN_SCORE = 10_000.0


def _window_counts(planes: Tensor) -> Tensor:
    """Pieces of each of the two planes in every window of four: ``[N, 2, 42]`` -> ``[N, 2, 69]``
    (one matrix product with the 0/1 window-membership matrix)."""
    return planes @ _C4_WINDOWS.to(planes.device, planes.dtype)


_C4_WINDOWS = torch.zeros(_C4.rows * _C4.cols, len(_C4_LINES)).scatter_(
    0, _C4_LINES.T.contiguous(), 1.0)  # [42, 69]: cell in window


def _planes(board: Tensor, sign: Tensor) -> Tensor:
    """``[N, 2, 42]`` float planes: the pieces of ``sign`` ``[N]``, then the other player's."""
    s = sign.to(torch.int8).unsqueeze(-1)
    return torch.stack([board == s, board == -s], 1).to(torch.float32)


def _score(counts: Tensor, planes: Tensor) -> Tensor:
    own, opp = counts[:, 0], counts[:, 1]
    own_score = torch.where(own == 3, 5.0, torch.where(own == 2, 2.0, 0.0))
    opp_score = torch.where(opp == 3, 5.0, torch.where(opp == 2, 2.0, 0.0))
    score = (own_score * (opp == 0) - opp_score * (own == 0)).sum(-1)
    centre = planes[:, 0].view(-1, _C4.rows, _C4.cols)[..., _C4.cols // 2]
    return score + 3.0 * centre.sum(-1)


def connect_four_heuristic(board: Tensor, player: Tensor) -> Tensor:
    """A static score ``[B]`` of boards ``[B, 42]`` for ``player`` (0/1, to move): over every
    window of four cells, +5 for three own pieces and an empty cell, +2 for two and two
    empty, the same negated for the opponent, +3 per own piece in the centre column."""
    planes = _planes(board, 1 - 2 * player)
    return _score(_window_counts(planes), planes)


def _c4_children(board: Tensor, player: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Every move from every board: ``(boards [B*7, 42], players [B*7], legal [B, 7], won [B, 7],
    full [B, 7], heuristic of the children for their player to move [B*7])``."""
    n, a = board.shape[0], _C4.cols
    legal = board.unflatten(-1, (_C4.rows, _C4.cols))[:, _C4.rows - 1] == 0
    b = board.repeat_interleave(a, 0)
    p = player.repeat_interleave(a, 0)
    action = torch.arange(a, device=board.device).repeat(n)
    height = (b.unflatten(-1, (_C4.rows, _C4.cols)) != 0).sum(-2)
    row = height.gather(-1, action.unsqueeze(-1)).squeeze(-1).clamp_max(_C4.rows - 1)
    cell = (row * _C4.cols + action).unsqueeze(-1)
    sign = 1 - 2 * p
    child = b.scatter(-1, cell, sign.to(torch.int8).unsqueeze(-1))
    planes = _planes(child, -sign)  # the child's player to move first
    counts = _window_counts(planes)
    won = (counts[:, 1] == 4).any(-1)
    full = (child != 0).all(-1)
    return child, 1 - p, legal, won.view(n, a), full.view(n, a), _score(counts, planes)


def negamax_connect_four(board: Tensor, player: Tensor, depth: int) -> Tensor:
    """Depth-limited minimax values of every move, ``[B, 7]`` for the player to move
    (``-inf`` for full columns): a winning move scores ``WIN_SCORE + depth left``, a move
    that fills the board 0, and at depth 0 the :func:`connect_four_heuristic`. Boards must
    not be finished. The same values as alpha-beta at that depth (alpha-beta only skips
    moves that cannot change them)."""
    child, child_player, legal, won, full, leaf = _c4_children(board, player)
    n, a = legal.shape
    if depth <= 1:
        rest = -leaf.view(n, a)
    else:
        rest = -negamax_connect_four(child, child_player, depth - 1).amax(-1).view(n, a)
    q = torch.where(won, WIN_SCORE + depth, torch.where(full, 0.0, rest))
    return torch.where(legal, q, float("-inf"))


class AlphaBetaPlayer:
    """A connect-four player that searches ``depth`` plies (default 4) and scores the leaves
    with :func:`connect_four_heuristic`. Reads ``"board"`` (``[B, 6, 7]`` or ``[B, 42]``,
    row 0 at the bottom) and ``"current_player"`` ``[B]``; writes ``"action"`` ``[B]``.
    Ties go to the central columns, or uniformly at random with ``generator``. Finished
    boards get action 0. Cost: ``B * 7**depth`` boards per move.

    Example:
        >>> import torch
        >>> from steersman.envs import ConnectFourEnv
        >>> from steersman.planning import AlphaBetaPlayer
        >>> env = ConnectFourEnv(batch_size=[1])
        >>> td = env.reset()
        >>> for a in (0, 6, 0, 6, 0):   # three in column 0: the second player must block
        ...     td["action"] = torch.tensor([a])
        ...     td = env.step(td)["next"]
        >>> AlphaBetaPlayer(depth=2)(td)["action"].tolist()
        [0]
    """

    def __init__(self, depth: int = 4, generator: torch.Generator | None = None) -> None:
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"AlphaBetaPlayer: depth must be an int >= 1, got {depth!r}")
        self.depth = depth
        self.generator = generator

    def __call__(self, tensordict: TensorDictBase) -> TensorDictBase:
        board = tensordict.get("board")
        board = board.flatten(-2) if board.ndim == 3 else board
        player = tensordict.get("current_player").reshape(board.shape[0])
        q = negamax_connect_four(board, player, self.depth)
        lines = board[:, _C4_LINES.to(board.device)]
        finished = (lines != 0).all(-1).logical_and((lines == lines[..., :1]).all(-1)).any(-1) | torch.isinf(q).all(-1)
        action = _pick(torch.where(finished.unsqueeze(-1), 0.0, q), self.generator, _CENTER_FIRST)
        tensordict.set("action", torch.where(finished, 0, action))
        return tensordict
