"""How chapter 8's merge exercise (:mod:`.ch08_merge`) reads the learner's ``merge``: which of the two
forms it is, from the arguments it needs, and the state it returned (names, shapes, dtype).

Two forms: the state ``ring_attention`` keeps, ``merge(m_a, l_a, o_a, m_b, l_b, o_b) → (m, l, o)``,
or the log-sum-exp form ``merge(out_a, lse_a, out_b, lse_b) → (out, lse)``. A merge with extra
parameters that have defaults is read by the ones it needs; one that takes ``*args`` is asked: handed
six tensors, does it return three?
"""

from __future__ import annotations

import inspect
import math

import torch

from ..exercises import AnswerError

FORMS = {6: ("m", "l", "o"), 4: ("out", "lse")}


class Bad(Exception):
    """The learner's merge returned something that is not the state: the message says what."""


def form_of(fn) -> tuple[str, ...]:
    """The names of the state ``fn`` returns, read from the arguments it needs and may take."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return FORMS[_asked(fn)]
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    needed = sum(p.default is p.empty for p in positional)
    most = math.inf if any(p.kind is p.VAR_POSITIONAL for p in params) else len(positional)
    fits = [n for n in FORMS if needed <= n <= most]
    if not fits:
        raise AnswerError(f"your merge takes {most if most < min(FORMS) else needed} arguments; write "
                          "merge(m_a, l_a, o_a, m_b, l_b, o_b) → (m, l, o), or the log-sum-exp form "
                          "merge(out_a, lse_a, out_b, lse_b) → (out, lse)")
    return FORMS[fits[0] if len(fits) == 1 else _asked(fn)]


def _asked(fn) -> int:
    """A merge that takes either count: 6 if, handed two states (m, l, o), it returns three values."""
    m, denom, o = torch.zeros(2, 1), torch.ones(2, 1), torch.ones(2, 3)
    try:
        got = fn(m, denom, o, m.clone(), denom.clone(), o.clone())
    except Exception:  # the learner's code: a merge of four arguments may raise on six
        return 4
    return 6 if isinstance(got, (tuple, list, dict)) and len(got) == 3 else 4


def read_state(got, names: tuple[str, ...], shapes: tuple, dtype: torch.dtype) -> tuple:
    """The merged state ``got`` as a tuple in the order of ``names``, or :class:`Bad`."""
    if isinstance(got, dict) and set(names) <= set(got):
        got = tuple(got[n] for n in names)
    if not isinstance(got, (tuple, list)) or len(got) != len(names) \
            or not all(isinstance(t, torch.Tensor) for t in got):
        what = type(got).__name__ if not isinstance(got, (tuple, list)) else f"{len(got)} values"
        raise Bad(f"your merge returned {what}; return the merged state ({', '.join(names)}) as a tuple "
                  "of tensors: the next block is merged into it")
    for name, t, shape in zip(names, got, shapes):
        if tuple(t.shape) != tuple(shape):
            raise Bad(f"your merge returned {name} of shape {tuple(t.shape)}; the state's {name} has "
                      f"shape {tuple(shape)} (one value per query{' and feature' if shape[-1] > 1 else ''})")
    for name, t in zip(names, got):
        if t.dtype != dtype:
            raise Bad(f"your merge returned {_name(t.dtype)} ({name} is {_name(t.dtype)}); the inputs are "
                      f"{_name(dtype)}: return the state in the inputs' dtype (a {_name(t.dtype)} tensor "
                      "or .double() inside the merge promotes everything it touches)")
    return tuple(got)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


__all__ = ["FORMS", "Bad", "form_of", "read_state"]
