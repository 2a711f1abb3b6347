"""Symlog and two-hot targets for the losses: the functions live in
:mod:`steersman.modules.two_hot` (shared with :class:`~steersman.modules.SymExpTwoHot`)."""

from __future__ import annotations

from ..modules.two_hot import symexp, symlog, two_hot_cross_entropy, two_hot_decode, two_hot_encode

__all__ = ["symlog", "symexp", "two_hot_encode", "two_hot_decode", "two_hot_cross_entropy"]
