"""Tic-tac-toe on B boards at once, as tensors."""

from __future__ import annotations

from torch import Tensor

from ._board import BoardGameEnv

__all__ = ["TicTacToeEnv"]


class TicTacToeEnv(BoardGameEnv):
    """Batched tic-tac-toe (TorchRL's name): two players alternate on a 3x3 board.

    Action: the cell ``0..8`` (row-major), ``Categorical(9)`` with the legal-move mask.
    Entries (batch ``[*batch]``): ``"board"`` int8 ``[*batch, 3, 3]`` (1 first player,
    -1 second), ``"observation"`` float ``[*batch, 2, 3, 3]`` (the mover's pieces, the
    opponent's), ``"current_player"`` int64 (0/1, who moves next), ``"action_mask"`` bool
    ``[*batch, 9]``. Reward ``[*batch, 1]``: +1 to the player whose move wins, else 0;
    ``terminated`` on a win or a full board (draw). Illegal moves raise
    :class:`~steersman.envs.InvalidActionError` (with ``check`` on).

    Args:
        batch_size: any batch shape. device: where the boards live.
        seed: seeds torch's RNG used by ``rand_action`` (the game is deterministic).
        check: refuse illegal moves (default True).

    Example:
        >>> import torch
        >>> from steersman.envs import TicTacToeEnv
        >>> env = TicTacToeEnv(batch_size=[2])
        >>> td = env.reset()
        >>> for a in (0, 3, 1, 4, 2):   # the first player fills the top row
        ...     td["action"] = torch.tensor([a, a])
        ...     td = env.step(td)["next"]
        >>> td["reward"].flatten().tolist(), td["terminated"].flatten().tolist()
        ([1.0, 1.0], [True, True])
    """

    rows = 3
    cols = 3
    win_length = 3
    num_actions = 9

    def _cells(self, board: Tensor, action: Tensor) -> Tensor:
        return action

    def _legal(self, board: Tensor) -> Tensor:
        return board == 0
