"""Two-player board games on B boards at once, as tensors (shared by tic-tac-toe and connect four).

A board is a flat int8 tensor ``[*batch, rows * cols]`` (row-major, row 0 at the
top for tic-tac-toe and at the *bottom* for connect four): ``0`` empty, ``1`` the first
player's piece, ``-1`` the second player's. A win is any precomputed line (``[L, k]``
cell indices) fully held by the player who just moved: one gather and two reductions
for every board at once.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from steersman.data import Bounded, Categorical, Composite, Unbounded
from steersman.tensordict import TensorDict, TensorDictBase

from ..common import EnvBase, invalid_action

__all__ = ["BoardGameEnv", "board_lines"]


def board_lines(rows: int, cols: int, k: int) -> Tensor:
    """The flat cell indices ``[L, k]`` of every horizontal, vertical and diagonal line of
    ``k`` cells on a ``rows x cols`` board.

    Example:
        >>> from steersman.envs.native._board import board_lines
        >>> board_lines(3, 3, 3).shape, board_lines(6, 7, 4).shape
        (torch.Size([8, 3]), torch.Size([69, 4]))
    """
    lines = []
    for r in range(rows):
        for c in range(cols):
            for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
                end_r, end_c = r + dr * (k - 1), c + dc * (k - 1)
                if 0 <= end_r < rows and 0 <= end_c < cols:
                    lines.append([(r + dr * i) * cols + (c + dc * i) for i in range(k)])
    return torch.tensor(lines, dtype=torch.int64)


class BoardGameEnv(EnvBase):
    """Base of the batched two-player board games (see :class:`TicTacToeEnv`).

    Subclasses set ``rows``, ``cols``, ``win_length``, ``num_actions`` and implement
    ``_cells(board, action) -> flat cell [*batch]`` and ``_legal(board) -> [*batch, A]``.

    Entries: ``"board"`` int8 ``[*batch, rows, cols]`` (1 first player, -1 second),
    ``"observation"`` float ``[*batch, 2, rows, cols]`` (the current player's pieces,
    then the opponent's), ``"current_player"`` int64 ``[*batch]`` (0 or 1: who moves
    next), ``"action_mask"`` bool ``[*batch, A]``. Action: ``Categorical(A)``; the legal
    moves are the ``"action_mask"`` entry (``rand_action`` draws legal moves). Reward ``[*batch, 1]``: +1 to
    the player who moved if the move wins, 0 otherwise (draws too). ``terminated`` on a
    win or a full board; never truncated. With ``check`` on (default), an illegal move
    (occupied cell, full column, finished board) raises
    :class:`~steersman.envs.InvalidActionError` naming the boards, before anything changes.
    """

    _handles_partial_reset = True
    rows: int
    cols: int
    win_length: int
    num_actions: int

    def __init__(self, batch_size: Any = (), device: Any = None, *, seed: int | None = None,
                 check: bool = True) -> None:
        super().__init__(device=device, batch_size=batch_size, check=check)
        bs, dev = self.batch_size, self.device
        n, a = self.rows * self.cols, self.num_actions
        self._lines = board_lines(self.rows, self.cols, self.win_length).to(dev)
        self._board = torch.zeros((*bs, n), dtype=torch.int8, device=dev)
        self._player = torch.zeros(bs, dtype=torch.int64, device=dev)
        self._over = torch.zeros(bs, dtype=torch.bool, device=dev)
        self.observation_spec = Composite(
            board=Bounded(-1, 1, shape=(*bs, self.rows, self.cols), dtype=torch.int8, device=dev),
            observation=Bounded(0.0, 1.0, shape=(*bs, 2, self.rows, self.cols), device=dev),
            current_player=Categorical(2, shape=bs, device=dev),
            action_mask=Categorical(2, shape=(*bs, a), dtype=torch.bool, device=dev),
            shape=bs, device=dev,
        )
        # unmasked: the legal moves change every step and are the "action_mask" entry
        # (a spec mask would make the actions of a whole rollout fail the spec check)
        self.action_spec = Categorical(a, shape=bs, device=dev)
        self.reward_spec = Unbounded(shape=(*bs, 1), device=dev)
        self._set_seed(seed)

    # ------------------------------------------------------------------ subclass API
    def _cells(self, board: Tensor, action: Tensor) -> Tensor:
        raise NotImplementedError

    def _legal(self, board: Tensor) -> Tensor:
        raise NotImplementedError

    # ------------------------------------------------------------------ state
    def get_state(self) -> TensorDictBase:
        """``"board"`` int8 ``[*batch, rows * cols]``, ``"current_player"`` and ``"over"`` (copies)."""
        return TensorDict({"board": self._board.clone(), "current_player": self._player.clone(),
                           "over": self._over.clone()}, batch_size=self.batch_size, device=self.device)

    def set_state(self, state: TensorDictBase | dict) -> None:
        """Overwrites the boards (``"board"`` ``[*batch, rows * cols]`` of -1/0/1), the player to
        move (``"current_player"``) and optionally the finished flags (``"over"``)."""
        bs, n = self.batch_size, self.rows * self.cols
        board = torch.as_tensor(state["board"], device=self.device).to(torch.int8).expand(*bs, n).clone()
        if bool(((board < -1) | (board > 1)).any()):
            raise ValueError(f"{type(self).__name__}.set_state: 'board' values must be -1, 0 or 1")
        player = torch.as_tensor(state["current_player"], device=self.device).to(torch.int64).expand(bs).clone()
        over = state["over"] if "over" in state.keys() else torch.zeros(bs, dtype=torch.bool)
        self._board, self._player = board, player
        self._over = torch.as_tensor(over, device=self.device).to(torch.bool).expand(bs).clone()

    def _set_seed(self, seed: int | None) -> None:
        """The games are deterministic; the seed only fixes ``rand_action``'s draws
        through torch's global RNG (as in every env)."""
        if seed is not None:
            torch.manual_seed(seed)

    # ------------------------------------------------------------------ helpers
    def _mask(self) -> Tensor:
        return self._legal(self._board) & ~self._over.unsqueeze(-1)

    def _obs(self, terminated: Tensor) -> dict:
        board, player = self._board, self._player
        shape = (*self.batch_size, self.rows, self.cols)
        sign = (1 - 2 * player).to(torch.int8).unsqueeze(-1)  # +1 for the first player
        own = board == sign
        opp = board == -sign
        mask = self._mask()
        return {
            "board": board.reshape(shape).clone(),
            "observation": torch.stack([own.reshape(shape), opp.reshape(shape)], -3).to(torch.float32),
            "current_player": player.clone(),
            "action_mask": mask,
            "done": terminated.clone(),
            "terminated": terminated,
            "truncated": torch.zeros_like(terminated),
        }

    # ------------------------------------------------------------------ env API
    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        if kwargs:
            raise TypeError(f"{type(self).__name__}.reset got unexpected arguments {sorted(kwargs)}")
        mask = self._reset_mask(tensordict)
        if mask is None:
            self._board = torch.zeros_like(self._board)
            self._player = torch.zeros_like(self._player)
            self._over = torch.zeros_like(self._over)
        else:
            self._board = self._board.masked_fill(mask.unsqueeze(-1), 0)
            self._player = self._player.masked_fill(mask, 0)
            self._over = self._over & ~mask
        out = self._obs(self._over.unsqueeze(-1).clone())
        return TensorDict(out, batch_size=self.batch_size, device=self.device)

    def _action_guard(self, tensordict: TensorDictBase) -> None:
        if not self.check or torch.compiler.is_compiling():
            return
        action = tensordict.get("action", None)
        if not isinstance(action, Tensor) or action.shape != self.batch_size or action.is_floating_point():
            super()._action_guard(tensordict)  # wrong type/shape/dtype: the generic report
            raise ValueError(
                f"{type(self).__name__}.step: 'action' must be an integer tensor of shape "
                f"{list(self.batch_size)}, got {getattr(action, 'dtype', type(action).__name__)} "
                f"of shape {list(getattr(action, 'shape', []))}"
            )
        spec = self.action_spec
        mask = self._mask()
        in_range = (action >= 0) & (action < self.num_actions)
        legal = mask.gather(-1, action.clamp(0, self.num_actions - 1).unsqueeze(-1)).squeeze(-1)
        legal = (legal | self._over) & in_range  # finished boards take any move (absorbing)
        if bool(legal.all()):
            return
        bad = (~legal).nonzero()
        first = tuple(bad[0].tolist())
        why = "out of range" if not bool(in_range[first]) else "the move is not legal (cell occupied or column full)"
        reason = (f"{bad.shape[0]} illegal move(s); first on board {first}: action {action[first].item()}, {why}; "
                  f"legal moves there: {mask[first].nonzero().flatten().tolist()}")
        raise invalid_action(self, "action", spec, action, reason)

    def rand_action(self, tensordict: TensorDictBase | None = None) -> TensorDictBase:
        """Writes a uniformly random *legal* move (torch's global RNG); finished boards get 0."""
        if tensordict is None:
            tensordict = TensorDict({}, batch_size=self.batch_size, device=self.device)
        mask = self._mask()
        u = torch.rand(mask.shape, device=self.device).masked_fill_(~mask, -1.0)
        tensordict.set("action", u.argmax(-1))
        return tensordict

    def transition(self, board: Tensor, player: Tensor, over: Tensor, action: Tensor
                   ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The game's step as a pure function of tensors (any batch shape; for search).

        Args: ``board`` int8 ``[*b, rows * cols]``, ``player`` int64 ``[*b]`` (to move),
        ``over`` bool ``[*b]`` (finished boards are absorbing), ``action`` int ``[*b]``
        (assumed legal: an illegal move leaves the board unchanged).

        Returns ``(board', player', over', reward [*b])``: ``over'`` is the terminated
        flag, ``reward`` +1 for the mover on a win.

        Example:
            >>> import torch
            >>> from steersman.envs import TicTacToeEnv
            >>> env = TicTacToeEnv()
            >>> b = torch.tensor([[1, 1, 0, -1, -1, 0, 0, 0, 0]], dtype=torch.int8)
            >>> _, p, over, r = env.transition(b, torch.tensor([0]), torch.tensor([False]), torch.tensor([2]))
            >>> p.tolist(), over.tolist(), r.tolist()
            ([1], [True], [1.0])
        """
        action = action.to(torch.int64)
        sign = (1 - 2 * player).to(torch.int8)
        cell = self._cells(board, action).clamp(0, board.shape[-1] - 1).unsqueeze(-1)  # a full column: 42
        free = board.gather(-1, cell) == 0
        new = board.scatter(-1, cell, sign.unsqueeze(-1))
        # finished boards stay as they are (and, with check off, so do boards given an illegal move)
        board = torch.where(free & ~over.unsqueeze(-1), new, board)
        mine = board == sign.unsqueeze(-1)
        won = mine[..., self._lines].all(-1).any(-1) & ~over
        full = (board != 0).all(-1)
        terminated = won | full | over
        return board, torch.where(over, player, 1 - player), terminated, won.to(torch.float32)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        action = tensordict.get("action")
        self._board, self._player, self._over, reward = self.transition(self._board, self._player, self._over,
                                                                         action)
        out = self._obs(self._over.unsqueeze(-1))
        out["reward"] = reward.unsqueeze(-1)
        return TensorDict(out, batch_size=self.batch_size, device=self.device)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(batch_size={list(self.batch_size)}, device={self.device})"
