"""Triton's interpreter (TRITON_INTERPRET=1) without work that checks nothing, for the tests' interpreted children.

- A launch patches ``triton.language`` for its run, and every call of a ``@triton.jit`` helper inside it
  patches it again, never undone (runtime/interpreter.py: ``InterpretedFunction.__call__``), through
  ``inspect.getmembers`` each time. A helper's patch of language modules already patched in the running
  launch changes nothing, so it is skipped.
- Integer overflow sanitizing (``InterpreterOptions.sanitize_overflow``) recomputes each integer add, sub
  and mul in int64 for a ``device_assert`` that language/semantic.py drops unless ``debug`` is on, which
  the interpreter never sets: without debug it is turned off.

Both together: 51 -> 24 CPU-s of tests/test_dispersion_kernel.py's interpreted checks.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect

import triton.language as tl
from triton.runtime import interpreter


@functools.cache
def _languages(fn) -> frozenset[str]:
    """The language modules ``_patch_lang`` patches for ``fn``: those its globals name."""
    return frozenset(v.__name__ for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core))


def skip_idle_work() -> None:
    """Call before the first launch."""
    options = interpreter.interpreter_builder.options
    if not options.debug:
        interpreter.interpreter_builder.options = dataclasses.replace(options, sanitize_overflow=False)
    patch = interpreter._patch_lang
    patched: set[str] = set()  # the language modules patched since the running launch began

    def patch_lang(fn):
        if patched and _languages(fn) <= patched:
            return interpreter._LangPatchScope()  # nothing to restore
        scope = patch(fn)
        if not patched:  # a launch's own patch: GridExecutor restores it when the launch ends
            restore = scope.restore

            def restore_and_end() -> None:
                patched.clear()
                restore()

            scope.restore = restore_and_end
        patched.update(_languages(fn))
        return scope

    interpreter._patch_lang = patch_lang
