"""The checkpoint quantization formats ``Fp8Config.from_hf`` reads, one module per format family.

A format is a parser from a checkpoint's quantization section (the ``quantization_config`` of a
config.json, or ModelOpt's hf_quant_config.json rewritten to one) to an ``Fp8Config``, registered
under the ``quant_method`` it reads, as vLLM keeps one file per method behind
``get_quantization_config(name)``:

    from vtnumba.seam import formats

    @formats.register("my-fp8")                        # or register(name, matches=lambda m: ...)
    def _parse(section):
        return Fp8Config("my-fp8", "tensor", "dynamic", tuple(section.get("ignore") or ()))

    formats.names()                  # ('modelopt', 'compressed-tensors', 'fp8', 'mxfp8', 'my-fp8')
    formats.parse({"quant_method": "my-fp8"})          # what Fp8Config.from_hf calls
    formats.parser("fp8")                              # one format's parser
    formats.unregister("my-fp8")

A new checkpoint format is a new module here and its name in the import line at the end of this file. The registered
names are also the ``quant_method`` values an ``Fp8Config`` accepts.
"""

from collections.abc import Callable
from typing import Any

__all__ = ["names", "parse", "parser", "register", "unregister", "layer_list"]

# name -> (matches(method) -> bool, parser(section) -> Fp8Config), in registration order
_REGISTRY: dict[str, tuple[Callable[[str], bool], Callable[[dict[str, Any]], Any]]] = {}


def register(name: str, *, matches: Callable[[str], bool] | None = None):
    """Decorator: register ``parser(section) -> Fp8Config`` for the ``quant_method`` ``name``.

    ``matches(method)`` says whether a lower-cased ``quant_method`` is this format's, for formats
    whose checkpoints spell it more than one way (ModelOpt's "modelopt_fp8"); by default only
    ``name`` itself is."""
    if not isinstance(name, str) or not name or name != name.lower():
        # from_hf lower-cases the checkpoint's quant_method, so an upper-case name would never match
        raise ValueError(f"format name must be a non-empty lower-case string, got {name!r}")
    if name in _REGISTRY:
        raise ValueError(
            f"format name must not be registered already, got {name!r} (registered: {', '.join(_REGISTRY)})"
        )
    if matches is not None and not callable(matches):
        raise TypeError(f"matches must be callable, got {type(matches).__name__}")

    def decorator(parser):
        if not callable(parser):
            raise TypeError(f"parser must be callable, got {type(parser).__name__}")
        _REGISTRY[name] = (matches or name.__eq__, parser)
        return parser

    return decorator


def unregister(name: str) -> None:
    """Remove the format registered as ``name`` (tests that register a toy format undo it so)."""
    if name not in _REGISTRY:
        raise ValueError(f"format name must be registered, got {name!r} (registered: {', '.join(_REGISTRY)})")
    del _REGISTRY[name]


def layer_list(section: dict[str, Any], key: str) -> tuple[str, ...]:
    """``section[key]``, a list of layer names or patterns (a format's skipped layers), as a tuple; ()
    when absent or null. Anything else is refused naming the key: a lone string would otherwise be
    read as a list of one-letter names, and skip nothing."""
    value = section.get(key)
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{key} must be a list of layer names or patterns, got {value!r}")
    return tuple(value)


def names() -> tuple[str, ...]:
    """The registered format names, in registration order: the ``quant_method`` values read."""
    return tuple(_REGISTRY)


def parser(name: str) -> Callable[[dict[str, Any]], Any]:
    """The parser registered as ``name`` (vLLM's ``get_quantization_config(name)``)."""
    if name not in _REGISTRY:
        raise ValueError(f"format name must be one of {', '.join(_REGISTRY)}, got {name!r}")
    return _REGISTRY[name][1]


def parse(section: dict[str, Any]):
    """The ``Fp8Config`` of a quantization section, by the first registered format whose name
    matches its (lower-cased) ``quant_method``."""
    method = str(section.get("quant_method", "")).lower()
    for matches, parser in _REGISTRY.values():
        if matches(method):
            return parser(section)
    raise ValueError(
        f"quant_method must be one of {', '.join(_REGISTRY)} (the FP8 formats vtnumba reads), "
        f"got {section.get('quant_method')!r}"
    )


# Imported last, as each module registers itself with the functions above. The order is the one
# error messages list the names in, and the one a quant_method is matched in: the import sorter skips it.
from . import modelopt, compressed_tensors, fp8, mxfp8  # noqa: E402,F401  # isort: skip
