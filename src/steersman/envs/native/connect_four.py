"""Connect four on B boards at once, as tensors."""

from __future__ import annotations

from torch import Tensor

from ._board import BoardGameEnv

__all__ = ["ConnectFourEnv"]


class ConnectFourEnv(BoardGameEnv):
    """Batched connect four: two players drop pieces into the 7 columns of a 6x7 board.

    Action: the column ``0..6``, ``Categorical(7)`` with the mask of non-full columns; the
    piece lands on the lowest empty row. ``"board"`` int8 ``[*batch, 6, 7]`` has row 0 at
    the *bottom* (1 first player, -1 second); ``"observation"`` float ``[*batch, 2, 6, 7]``
    (the mover's pieces, the opponent's), ``"current_player"`` int64, ``"action_mask"``
    bool ``[*batch, 7]``. Reward ``[*batch, 1]``: +1 to the player whose move makes four
    in a row (horizontal, vertical or diagonal), else 0; ``terminated`` on a win or a full
    board. A move into a full column raises :class:`~steersman.envs.InvalidActionError`
    (with ``check`` on).

    Args: as :class:`~steersman.envs.TicTacToeEnv`.

    Example:
        >>> import torch
        >>> from steersman.envs import ConnectFourEnv
        >>> env = ConnectFourEnv(batch_size=[3])
        >>> td = env.reset()
        >>> for a in (0, 1, 0, 1, 0, 1, 0):   # four in column 0 for the first player
        ...     td["action"] = torch.full((3,), a)
        ...     td = env.step(td)["next"]
        >>> td["reward"].flatten().tolist(), td["board"][0, :, 0].tolist()
        ([1.0, 1.0, 1.0], [1, 1, 1, 1, 0, 0])
    """

    rows = 6
    cols = 7
    win_length = 4
    num_actions = 7

    def _cells(self, board: Tensor, action: Tensor) -> Tensor:
        height = (board.unflatten(-1, (self.rows, self.cols)) != 0).sum(-2)  # [*batch, 7]
        row = height.gather(-1, action.unsqueeze(-1)).squeeze(-1)
        return row * self.cols + action

    def _legal(self, board: Tensor) -> Tensor:
        top = board.unflatten(-1, (self.rows, self.cols))[..., self.rows - 1, :]
        return top == 0


