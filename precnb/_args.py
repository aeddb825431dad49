"""One argument order: where one run is diagnosed and a baseline is optional, the baseline is a keyword.

``precnb diff BASE TARGET``, :func:`precnb.first_divergence`, :func:`precnb.align`,
:func:`precnb.tensor_metrics` and :func:`precnb.preflight` take two required runs, baseline first.
:func:`precnb.diagnose`, :func:`precnb.explore` and :func:`precnb.report.write_html` take the run
diagnosed first and the baseline only as ``baseline=``: a second run passed by position would be
read in the opposite order from the command line, so it is a :class:`TypeError`, never a silent swap.

Examples
--------
>>> @baseline_keyword()
... def diagnose(target, *, baseline=None):
...     return target, baseline
>>> diagnose("t", baseline="b")
('t', 'b')
>>> diagnose("t", "b")
Traceback (most recent call last):
...
TypeError: diagnose() takes the baseline as a keyword: diagnose(target, baseline=...)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["baseline_keyword"]

F = TypeVar("F", bound=Callable[..., Any])


def baseline_keyword(positional: int = 1, *, call: str = "target") -> Callable[[F], F]:
    """Decorate a function whose first *positional* arguments are positional and whose baseline is keyword-only.

    Parameters
    ----------
    positional : int
        How many positional arguments the function takes (1: ``diagnose(target)``; 2:
        ``write_html(target, path)``).
    call : str
        The positional arguments as the message shows them (``"target, path"``).

    Returns
    -------
    callable
        The decorator: more positional arguments raise ``TypeError`` naming ``baseline=``;
        :func:`inspect.signature` still shows the function's own signature.
    """
    def decorate(func: F) -> F:
        name = func.__name__

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if len(args) > positional:
                raise TypeError(f"{name}() takes the baseline as a keyword: {name}({call}, baseline=...)")
            return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate
