"""Tic-tac-toe on B boards at once, as tensors."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from steersman.tensordict import TensorDict, TensorDictBase

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

    Keyword Args:
        single_player: the env plays the second player itself: after each move of the
            first player (the agent), a uniformly random legal reply (torch's global RNG)
            is played in the same ``step``. The agent always moves next
            (``"current_player"`` 0), and its reward is +1 when its move wins, -1 when the
            reply wins, 0 otherwise. Default ``False``: the two players alternate.
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

    def __init__(self, batch_size: Any = (), device: Any = None, *, single_player: bool = False,
                 seed: int | None = None, check: bool = True) -> None:
        if not isinstance(single_player, bool):
            raise TypeError(f"TicTacToeEnv: single_player must be a bool, got {type(single_player).__name__}")
        super().__init__(batch_size, device, seed=seed, check=check)
        self.single_player = single_player

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        out = super()._step(tensordict)
        if not self.single_player:
            return out
        # the second player's random legal reply on the boards still in play
        mask = self._mask()
        u = torch.rand(mask.shape, device=self.device).masked_fill_(~mask, -1.0)
        self._board, self._player, self._over, lost = self.transition(
            self._board, self._player, self._over, u.argmax(-1))
        self._player = torch.zeros_like(self._player)  # the agent moves next (also on finished boards)
        res = self._obs(self._over.unsqueeze(-1))
        res["reward"] = out.get("reward") - lost.unsqueeze(-1)
        return TensorDict(res, batch_size=self.batch_size, device=self.device)

    def __repr__(self) -> str:
        extra = ", single_player=True" if self.single_player else ""
        return f"{type(self).__name__}(batch_size={list(self.batch_size)}, device={self.device}{extra})"

    def _cells(self, board: Tensor, action: Tensor) -> Tensor:
        return action

    def _legal(self, board: Tensor) -> Tensor:
        return board == 0
