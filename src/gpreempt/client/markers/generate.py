"""Marking each call of Hugging Face ``generate`` (``transformers``' ``GenerationMixin``) as a
request: a server that decodes with ``model.generate(...)`` in a loop of its own, outside any
HTTP framework, gives no other sign of where its requests begin and end.

Decoding is mostly CPU time between short launches (sampling, stopping criteria, cache
bookkeeping), so a server's launches alone make its activity flicker through each call; marked,
a call counts as one request from its start until it returns, every token decoded, as
``with gpreempt.request():`` around it would. But a call is only part of a request: the
prompt's copy to the GPU comes before it and the answer's copy back after it, and a server may
run other GPU work beside (an embedding, a classifier). So unlike a marker of whole requests,
these marks add to the server's launches rather than replace them: outside a call its
launches still say when it is active. A call on a model class that overrides ``generate``
without calling the mixin's is not marked.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

from .base import Mark, marking_session

_WRAPPED = "__gpreempt_marks_requests__"


def patch_generation(module: ModuleType) -> None:
    """Wrap ``module.GenerationMixin.generate`` (``transformers.generation.utils``) once."""
    mixin = getattr(module, "GenerationMixin", None)
    original = getattr(mixin, "generate", None)
    if mixin is None or not callable(original):
        raise AttributeError(f"{module.__name__} has no GenerationMixin.generate")
    if getattr(original, _WRAPPED, False):
        return

    @functools.wraps(original)
    def generate(self: Any, *args: Any, **kwargs: Any) -> Any:
        current = marking_session("generate")
        if current is None:
            return original(self, *args, **kwargs)
        mark = Mark(current, whole=False)
        try:
            return original(self, *args, **kwargs)
        finally:
            mark.close()

    setattr(generate, _WRAPPED, True)
    mixin.generate = generate
