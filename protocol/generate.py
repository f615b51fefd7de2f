"""Generate kio-compatible message classes from the JSON definitions in ``schemas/``.

    python -m protocol.generate            # (re)write protocol/messages/
    python -m protocol.generate --check    # exit 1 naming the files that are out of date

Each ``schemas/FooBar.json`` becomes ``protocol/messages/foo_bar.py``. The ``commonStructs``
(ConnectorTaskId, ConnectorsAndTasks) are generated once into ``common.py`` and imported by
the modules that use them. Annotations are plain Python types (``int``, ``str``, ...); the
Kafka type sits in the field metadata, which is what kio's entity_reader/entity_writer use.

A message of several versions (``"validVersions": "0-1"``, fields added with
``"versions": "1+"``) gets its newest version under the plain names and each older one that
lacks some field with the version as a suffix (``ConnectGroupDescribeResponseV0``,
``DescribedGroupV0``), each holding only the fields of its version: kio encodes a class's
fields, so a client of an older version is answered in exactly the bytes it knows. Tagged
fields are not used: a reader that meets a tag it does not know must skip it, and kio's
reader does not.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCHEMA_DIR = ROOT / "schemas"
OUTPUT_DIR = Path(__file__).resolve().parent / "messages"
LINE_LENGTH = 100

# Kafka primitive type -> Python annotation.
PRIMITIVES: dict[str, str] = {
    "bool": "bool",
    "int8": "int",
    "int16": "int",
    "int32": "int",
    "int64": "int",
    "uint16": "int",
    "float64": "float",
    "string": "str",
    "bytes": "bytes",
}

ENTITY_TYPES: dict[str, str] = {
    "request": "EntityType.request",
    "response": "EntityType.response",
    # kio models stored records (e.g. SnapshotHeaderRecord) as EntityType.data.
    "coordinator-key": "EntityType.data",
    "coordinator-value": "EntityType.data",
}

HEADER_IMPORTS: dict[str, str] = {
    "request": "from kio.schema.request_header.v2.header import RequestHeader",
    "response": "from kio.schema.response_header.v1.header import ResponseHeader",
}
HEADER_CLASSES: dict[str, str] = {"request": "RequestHeader", "response": "ResponseHeader"}


class SchemaError(ValueError):
    """A JSON definition the generator cannot (or must not) turn into code."""


def snake_case(name: str) -> str:
    """``OwnedConnectorsAndTasks`` -> ``owned_connectors_and_tasks``."""
    name = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    return re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()


def load_schema(path: Path) -> dict[str, Any]:
    """Parse one definition; Kafka's files carry ``//`` comment lines that JSON forbids."""
    text = "\n".join(
        line for line in path.read_text().splitlines() if not line.lstrip().startswith("//")
    )
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as error:
        raise SchemaError(f"{path.name}: not valid JSON: {error}") from None
    if not isinstance(schema, dict):
        raise SchemaError(f"{path.name}: the top level must be an object")
    for key in ("name", "type", "validVersions", "flexibleVersions", "fields"):
        if key not in schema:
            raise SchemaError(f"{path.name}: missing {key!r}")
    if schema["type"] not in ENTITY_TYPES:
        raise SchemaError(f"{path.name}: unsupported message type {schema['type']!r}")
    if "apiKey" not in schema:
        raise SchemaError(f"{path.name}: missing 'apiKey'")
    if _newest_version(schema["validVersions"]) is None:
        raise SchemaError(f"{path.name}: validVersions must be '0' or '0-N'")
    if schema["flexibleVersions"] not in ("0+", "none"):
        raise SchemaError(f"{path.name}: flexibleVersions must be '0+' or 'none'")
    return schema


def _newest_version(valid: object) -> int | None:
    """The newest version of ``validVersions`` ("0" or "0-N"), None if it is neither."""
    match = re.fullmatch(r"0(?:-([1-9][0-9]?))?", str(valid))
    if match is None:
        return None
    return int(match.group(1) or 0)


def _first_version(field: dict[str, Any], key: str = "versions") -> int:
    """The first version of a field's ``versions`` (or ``nullableVersions``), "N+"."""
    match = re.fullmatch(r"([0-9]+)\+", str(field.get(key, "0+")))
    if match is None:
        raise SchemaError(f"{field.get('name')}: {key} must be 'N+'")
    return int(match.group(1))


@dataclass(frozen=True)
class StructDef:
    name: str
    fields: tuple[dict[str, Any], ...]


def _check_field(owner: str, field: dict[str, Any], newest: int = 0) -> None:
    for key in ("name", "type"):
        if key not in field:
            raise SchemaError(f"{owner}: a field lacks {key!r}")
    if "taggedVersions" in field or "tag" in field:
        raise SchemaError(f"{owner}.{field['name']}: tagged fields are not supported")
    first = _first_version(field)
    if first > newest:
        raise SchemaError(f"{owner}.{field['name']}: versions {field['versions']} "
                          f"start after the newest version {newest}")


def _escape_docstring(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')


def _docstring(text: str, indent: str) -> list[str]:
    text = _escape_docstring(" ".join(text.split()))
    one_line = f'{indent}"""{text}"""'
    if len(one_line) <= LINE_LENGTH:
        return [one_line]
    wrapped = textwrap.wrap(text, width=LINE_LENGTH - len(indent))
    return [f'{indent}"""', *(indent + line for line in wrapped), f'{indent}"""']


class ModuleBuilder:
    """Builds the source of one module: its structs, nested ones first."""

    def __init__(
        self,
        schema: dict[str, Any],
        source_label: str,
        common: dict[str, StructDef],
    ) -> None:
        self.schema = schema
        self.source_label = source_label
        self.kind: str = schema["type"]
        self.flexible: bool = schema["flexibleVersions"] == "0+"
        self.common = common
        self.declared_common = {struct["name"] for struct in schema.get("commonStructs", [])}
        self.structs: dict[str, StructDef] = {}
        self.used_common: set[str] = set()
        self.uses_none_default = False
        self.newest = _newest_version(schema.get("validVersions", "0")) or 0
        # The version being rendered, and the suffix of its struct names ("" for the newest).
        self.version = self.newest
        self.suffix = ""

    # -- collecting structs ------------------------------------------------------------

    def collect(self, struct: StructDef) -> None:
        for field in struct.fields:
            _check_field(struct.name, field, self.newest)
            if "fields" in field:
                nested = StructDef(field["type"].removeprefix("[]"), tuple(field["fields"]))
                self.collect(nested)
        self._add_struct(struct)

    def _add_struct(self, struct: StructDef) -> None:
        if struct.name in self.common:
            raise SchemaError(f"{self.source_label}: struct {struct.name} shadows a common struct")
        previous = self.structs.get(struct.name)
        if previous is not None and previous != struct:
            raise SchemaError(
                f"{self.source_label}: two different structs are named {struct.name}"
            )
        self.structs[struct.name] = struct

    # -- rendering -----------------------------------------------------------------------

    def annotation(self, owner: str, field: dict[str, Any]) -> tuple[str, str | None]:
        """(Python annotation, kafka_type metadata or None for struct fields)."""
        kafka_type: str = field["type"]
        is_array = kafka_type.startswith("[]")
        element = kafka_type.removeprefix("[]")
        if element in PRIMITIVES:
            if "fields" in field:
                raise SchemaError(f"{owner}.{field['name']}: a primitive cannot have fields")
            python, meta = PRIMITIVES[element], element
        elif "fields" in field or element in self.structs:
            python, meta = element + self.suffix, None
        elif element in self.common:
            if element not in self.declared_common:
                raise SchemaError(
                    f"{self.source_label}: uses {element} without declaring it in commonStructs"
                )
            self.used_common.add(element)
            python, meta = element, None
        else:
            raise SchemaError(f"{owner}.{field['name']}: unknown type {kafka_type!r}")
        if is_array:
            python = f"tuple[{python}, ...]"
        if "nullableVersions" in field:
            if field["nullableVersions"] not in ("0+", field.get("versions", "0+")):
                raise SchemaError(f"{owner}.{field['name']}: nullableVersions must be '0+' "
                                  "or the field's versions")
            if element in PRIMITIVES and not is_array and element not in ("string", "bytes"):
                raise SchemaError(f"{owner}.{field['name']}: {element} cannot be nullable")
            python = f"{python} | None"
        return python, meta

    def default(self, owner: str, field: dict[str, Any]) -> str | None:
        if "default" not in field:
            return None
        value = str(field["default"])
        if value == "null":
            if "nullableVersions" not in field:
                raise SchemaError(f"{owner}.{field['name']}: default null on a non-null field")
            return "None"
        if field["type"] not in ("int8", "int16", "int32", "int64", "uint16"):
            raise SchemaError(f"{owner}.{field['name']}: unsupported default {value!r}")
        try:
            return str(int(value, 0))
        except ValueError:
            raise SchemaError(f"{owner}.{field['name']}: bad default {value!r}") from None

    def class_source(self, struct: StructDef, entity_type: str, header: str | None) -> list[str]:
        lines = [
            "@dataclass(frozen=True, slots=True, kw_only=True)",
            f"class {struct.name}{self.suffix}:",
            f"    __type__: ClassVar[EntityType] = {entity_type}",
            f"    __version__: ClassVar[i16] = i16({self.version})",
            f"    __flexible__: ClassVar[bool] = {self.flexible}",
            f"    __api_key__: ClassVar[i16] = i16({int(self.schema['apiKey'])})",
        ]
        if header is not None:
            lines.append(f"    __header_schema__: ClassVar[type[{header}]] = {header}")
        for field in struct.fields:
            if _first_version(field) <= self.version:
                lines.extend(self.field_source(struct.name, field))
        return lines

    def field_source(self, owner: str, field: dict[str, Any]) -> list[str]:
        name = snake_case(field["name"])
        python, meta = self.annotation(owner, field)
        default = self.default(owner, field)
        arguments = []
        if meta is not None:
            arguments.append(f'metadata={{"kafka_type": "{meta}"}}')
        if default is not None:
            arguments.append(f"default={default}")
        if not arguments:
            declaration = [f"    {name}: {python}"]
        elif meta is None:
            # A struct with a default: a plain default reads better than field().
            declaration = [f"    {name}: {python} = {default}"]
        else:
            joined = ", ".join(arguments)
            declaration = [f"    {name}: {python} = field({joined})"]
            if len(declaration[0]) > LINE_LENGTH:
                declaration = [f"    {name}: {python} = field(", f"        {joined}", "    )"]
        return declaration + _docstring(field.get("about", ""), "    ")

    def _lacks_fields(self, version: int) -> bool:
        return any(_first_version(field) > version
                   for struct in self.structs.values() for field in struct.fields)

    def older_versions(self) -> list[int]:
        """The older versions that get classes of their own (suffixed V0, V1...)."""
        self.collect(StructDef(self.schema["name"], tuple(self.schema["fields"])))
        return [version for version in range(self.newest) if self._lacks_fields(version)]

    def source(self) -> str:
        top = StructDef(self.schema["name"], tuple(self.schema["fields"]))
        self.collect(top)
        header_class = HEADER_CLASSES.get(self.kind)
        classes = []
        # An older version gets classes of its own only if it lacks some field.
        changed = [version for version in range(self.newest, -1, -1)
                   if version == self.newest or self._lacks_fields(version)]
        for version in changed:
            self.version = version
            self.suffix = "" if version == self.newest else f"V{version}"
            for struct in self.structs.values():
                entity_type = ENTITY_TYPES[self.kind] if struct is top else "EntityType.nested"
                classes.append("\n".join(self.class_source(struct, entity_type, header_class)))
        if self.used_common and not self.flexible:
            # common.py is generated flexible; a non-flexible user would encode them wrongly.
            raise SchemaError(f"{self.source_label}: uses common structs but is not flexible")
        imports = ["from dataclasses import dataclass, field", "from typing import ClassVar", ""]
        if self.kind in HEADER_IMPORTS:
            imports.append(HEADER_IMPORTS[self.kind])
        imports += [
            "from kio.static.constants import EntityType",
            "from kio.static.primitive import i16",
        ]
        if self.used_common:
            common_names = sorted(self.used_common, key=str.lower)  # isort's order
            imports += ["", *_import_line("protocol.messages.common", common_names)]
        return render_module(
            f"schemas/{self.source_label}", self.schema.get("about"), imports, classes
        )


def render_module(
    origin: str, about: str | None, imports: list[str], classes: Iterable[str]
) -> str:
    header = [
        f"# Generated by protocol/generate.py from {origin}.",
        "# Do not edit: change the JSON and run `python -m protocol.generate`.",
    ]
    docstring = _docstring(about, "") if about else []
    parts = ["\n".join(header + docstring), "\n".join(imports)]
    if not any("field(" in cls for cls in classes):
        parts[1] = parts[1].replace("import dataclass, field", "import dataclass")
    return "\n\n".join(parts) + "\n\n\n" + "\n\n\n".join(classes) + "\n"


def _ordered_common(common: dict[str, StructDef]) -> list[StructDef]:
    """Common structs with every struct after the common structs it refers to."""
    ordered: list[StructDef] = []
    visiting: set[str] = set()

    def visit(struct: StructDef) -> None:
        if struct in ordered:
            return
        if struct.name in visiting:
            raise SchemaError(f"common struct {struct.name} refers to itself")
        visiting.add(struct.name)
        for field in struct.fields:
            element = field["type"].removeprefix("[]")
            if element in common:
                visit(common[element])
        visiting.discard(struct.name)
        ordered.append(struct)

    for struct in common.values():
        visit(struct)
    return ordered


def common_source(common: dict[str, StructDef]) -> str:
    # Common structs are nested entities with several parents, so they get no header schema
    # and no meaningful api key (-1); kio's codec reads neither on nested entities.
    builder = ModuleBuilder(
        {"name": "", "type": "common", "apiKey": -1, "flexibleVersions": "0+", "fields": []},
        "commonStructs",
        {},
    )
    builder.structs = {struct.name: struct for struct in common.values()}
    classes = []
    for struct in _ordered_common(common):
        for field in struct.fields:
            _check_field(struct.name, field)
            if "fields" in field:
                raise SchemaError(f"common struct {struct.name}: nested structs not supported")
        classes.append("\n".join(builder.class_source(struct, "EntityType.nested", None)))
    imports = [
        "from dataclasses import dataclass, field",
        "from typing import ClassVar",
        "",
        "from kio.static.constants import EntityType",
        "from kio.static.primitive import i16",
    ]
    return render_module(
        "the commonStructs of schemas/*.json",
        "Structures shared by several messages and records.",
        imports,
        classes,
    )


def _import_line(module: str, names: list[str]) -> list[str]:
    line = f"from {module} import {', '.join(names)}"
    if len(line) <= LINE_LENGTH:
        return [line]
    return [f"from {module} import (", *(f"    {name}," for name in names), ")"]


def init_source(common_names: list[str], modules: list[tuple[str, list[str]]]) -> str:
    header = [
        "# Generated by protocol/generate.py from schemas/*.json.",
        "# Do not edit: change the JSON and run `python -m protocol.generate`.",
        '"""Every generated message and record class, and the common structs."""',
        "",
    ]
    # One import per module, in module order (as ruff's isort sorts them).
    imports = [("common", sorted(common_names, key=str.lower))]
    imports += [(module, sorted(class_names, key=str.lower)) for module, class_names in modules]
    lines: list[str] = []
    for module, names in sorted(imports):
        lines += _import_line(f"protocol.messages.{module}", names)
    exported = sorted(common_names + [name for _, names in modules for name in names])
    lines += ["", "__all__ = [", *(f'    "{name}",' for name in exported), "]"]
    return "\n".join(header + lines) + "\n"


def generate(schema_dir: Path = SCHEMA_DIR) -> dict[str, str]:
    """File name -> source, for every module of ``protocol/messages/``."""
    paths = sorted(schema_dir.glob("*.json"))
    if not paths:
        raise SchemaError(f"no *.json definitions in {schema_dir}")
    schemas = {path.name: load_schema(path) for path in paths}

    common: dict[str, StructDef] = {}
    for file_name, schema in schemas.items():
        for raw in schema.get("commonStructs", []):
            struct = StructDef(raw["name"], tuple(raw["fields"]))
            previous = common.setdefault(struct.name, struct)
            if previous != struct:
                raise SchemaError(f"{file_name}: common struct {struct.name} differs elsewhere")

    files = {"common.py": common_source(common)}
    modules: list[tuple[str, list[str]]] = []
    for file_name, schema in schemas.items():
        module = snake_case(file_name.removesuffix(".json"))
        if snake_case(schema["name"]) != module:
            raise SchemaError(f"{file_name}: file name and message name {schema['name']} differ")
        files[f"{module}.py"] = ModuleBuilder(schema, file_name, common).source()
        older = ModuleBuilder(schema, file_name, common).older_versions()
        modules.append((module, [schema["name"], *(f"{schema['name']}V{v}" for v in older)]))
    files["__init__.py"] = init_source(list(common), modules)
    return files


def out_of_date(files: dict[str, str], output_dir: Path = OUTPUT_DIR) -> list[str]:
    """Generated files that are missing, differ, or should not be there."""
    stale = [
        name
        for name, source in files.items()
        if not (output_dir / name).is_file() or (output_dir / name).read_text() != source
    ]
    stale += [path.name for path in output_dir.glob("*.py") if path.name not in files]
    return sorted(stale)


def write(files: dict[str, str], output_dir: Path = OUTPUT_DIR) -> None:
    output_dir.mkdir(parents=True, exist_ok=True)
    for path in output_dir.glob("*.py"):
        if path.name not in files:
            path.unlink()
    for name, source in files.items():
        target = output_dir / name
        if not target.is_file() or target.read_text() != source:
            target.write_text(source)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m protocol.generate",
        description="Generate protocol/messages/ from schemas/*.json.",
    )
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if the output is out of date"
    )
    parser.add_argument("--schemas", type=Path, default=SCHEMA_DIR, help="definitions directory")
    parser.add_argument("--out", type=Path, default=OUTPUT_DIR, help="output directory")
    args = parser.parse_args(argv)
    try:
        files = generate(args.schemas)
    except SchemaError as error:
        print(f"schema error: {error}", file=sys.stderr)
        return 2
    if args.check:
        stale = out_of_date(files, args.out)
        if stale:
            print(
                f"out of date in {args.out}: {', '.join(stale)} "
                "(run python -m protocol.generate)",
                file=sys.stderr,
            )
            return 1
        return 0
    write(files, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
