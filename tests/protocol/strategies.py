"""Hypothesis strategies for the generated classes, derived from their dataclass fields."""

from __future__ import annotations

import dataclasses
import inspect
import types
from typing import Any, Union, get_args, get_origin

from hypothesis import strategies as st

import protocol.messages
from protocol.records import RECORD_TYPES

INTEGER_RANGES = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint16": (0, 2**16 - 1),
}
MAX_ITEMS = 3  # keeps nested arrays of arrays small and the examples fast

# Kafka strings are UTF-8: lone surrogates cannot be encoded.
text = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)


def _primitive(kafka_type: str) -> st.SearchStrategy[Any]:
    if kafka_type in INTEGER_RANGES:
        low, high = INTEGER_RANGES[kafka_type]
        return st.integers(low, high)
    if kafka_type == "string":
        return text
    if kafka_type == "bytes":
        return st.binary(max_size=12)
    if kafka_type == "bool":
        return st.booleans()
    raise AssertionError(f"no strategy for kafka_type {kafka_type}")


def _for_type(annotation: Any, kafka_type: str | None) -> st.SearchStrategy[Any]:
    origin = get_origin(annotation)
    if origin in (types.UnionType, Union):
        (inner,) = (arg for arg in get_args(annotation) if arg is not type(None))
        return st.none() | _for_type(inner, kafka_type)
    if origin is tuple:
        element, _ellipsis = get_args(annotation)
        return st.lists(_for_type(element, kafka_type), max_size=MAX_ITEMS).map(tuple)
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        return entities(annotation)
    assert kafka_type is not None, annotation
    return _primitive(kafka_type)


_STRATEGIES: dict[type[Any], st.SearchStrategy[Any]] = {}


def entities(entity_type: type[Any]) -> st.SearchStrategy[Any]:
    """Instances of a generated class with every field (defaulted ones too) drawn."""
    if entity_type not in _STRATEGIES:
        _STRATEGIES[entity_type] = _build(entity_type)
    return _STRATEGIES[entity_type]


def _build(entity_type: type[Any]) -> st.SearchStrategy[Any]:
    return st.builds(
        entity_type,
        **{
            field.name: _for_type(field.type, field.metadata.get("kafka_type"))
            for field in dataclasses.fields(entity_type)
        },
    )


def generated_classes() -> list[type[Any]]:
    """Every class defined in protocol/messages/, nested ones included."""
    classes: dict[str, type[Any]] = {}
    for module_name in protocol.messages.__all__:
        module = inspect.getmodule(getattr(protocol.messages, module_name))
        assert module is not None
        for name, value in vars(module).items():
            if inspect.isclass(value) and dataclasses.is_dataclass(value):
                if value.__module__ == module.__name__:
                    classes[f"{value.__module__}.{name}"] = value
    return [classes[name] for name in sorted(classes)]


def record_pairs() -> list[tuple[int, type[Any], type[Any]]]:
    return [(type_id, key, value) for type_id, (key, value) in sorted(RECORD_TYPES.items())]
