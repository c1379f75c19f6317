"""Configuration files: YAML loaded once into frozen dataclasses, every problem with file and line.

A component declares its configuration as frozen dataclasses (the *schema*) and calls
:func:`load_config`. The YAML is parsed with the safe loader into nodes that keep their position,
then built field by field from the dataclasses' type hints:

- ``str``, ``int``, ``float``, ``bool``, ``StrEnum`` subclasses, ``Literal[...]``;
- nested dataclasses, ``tuple[T, ...]`` (from a YAML list), ``Mapping[str, T]``, ``T | None``;
- a union of dataclasses told apart by their ``type: Literal["name"]`` field, or a
  :class:`PluginConfig` family: every configuration registered in it, told apart the same way;
- :class:`Secret`: written as a reference, ``env:NAME`` or ``file:/path``, never as the value;
- :class:`FileReference`: a file the program opens itself (a TLS certificate, key or CA), written
  ``file:PATH`` like a secret and, like one, relative to the configuration's directory.

Unknown keys are errors; so are duplicate keys. A field's default comes from the dataclass;
:func:`setting` adds bounds and the help text that :func:`reference` turns into documentation. A
dataclass may define ``config_problems(self) -> Iterable[str]`` for rules across fields. Every
problem is collected (``manager.yaml, line 12: pools[0].k: must be at least 1, not 0``) and
raised together in one :class:`~dnslb.errors.ConfigError`. Settings built in code rather than
read from a file get the same checks from :func:`checked` (their list from :func:`problems_of`),
not from a ``__post_init__`` of their own. :func:`dump_config` is the inverse of loading: a
program that starts another (the local provider starting an agent) writes its config with it.
"""

from __future__ import annotations

import builtins
import dataclasses
import enum
import functools
import inspect
import math
import os
import stat
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from dnslb.errors import ConfigError
from dnslb.plan_store import read_regular_file

if TYPE_CHECKING:
    import yaml
_yaml_loaded = False  # yaml is bound by _yaml(): the core installs and imports without PyYAML


def _yaml() -> Any:
    """PyYAML, imported when a configuration is first read or written (every component that
    reads one installs it; the core and the pipe backend do not need it)."""
    global _yaml_loaded  # noqa: PLW0603
    if not _yaml_loaded:
        try:
            import yaml as module  # noqa: PLC0415
        except ImportError:
            raise ConfigError(
                "configuration", ["PyYAML is not installed: pip install 'dnslb[manager]'"]
            ) from None
        globals()["yaml"] = module
        _yaml_loaded = True
    return yaml


_T = TypeVar("_T")


class PluginConfig:
    """The base of one kind of plugin's configuration classes, which a ``type`` key tells apart.

    A kind of plugin (cloud providers, utilization sources, health checks) declares its family
    as a direct subclass, not a dataclass, whose bare annotations name the fields every plugin of
    the kind must have (``type`` is declared here; registering a plugin without one fails)::

        class HealthCheckConfig(PluginConfig):
            __slots__ = ()
            interval: float

    Each plugin's configuration is a frozen dataclass deriving from its family, with a field
    ``type: Literal["name"]``, registered with ``@HealthCheckConfig.register`` (above
    ``@dataclass``). A field typed with the family (``check: HealthCheckConfig | None``) accepts
    the configuration of every plugin registered when the document is built, chosen by its
    ``type`` key; the reference and the JSON Schema list them by name.
    """

    __slots__ = ()
    type: str  # each plugin narrows it to its ``Literal["name"]``
    _plugins: ClassVar[dict[str, builtins.type[PluginConfig]]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if PluginConfig in cls.__bases__:
            cls._plugins = {}  # a new family: its own registry

    @classmethod
    def register(cls, plugin: builtins.type[_P]) -> builtins.type[_P]:
        """Class decorator: accept ``plugin``'s configuration wherever the family is a field's type.

        ``plugin`` must be a dataclass deriving from the family with every attribute the family
        declares as a field; its name is its ``type`` (:func:`plugin_name`), unique in the family.
        """
        if "_plugins" not in cls.__dict__:
            raise TypeError(f"{cls.__name__} is not a family of plugins (a PluginConfig subclass)")
        candidate: Any = plugin  # checked here for callers mypy does not see
        if not (dataclasses.is_dataclass(candidate) and isinstance(candidate, builtins.type)):
            raise TypeError(f"{plugin!r} must be a dataclass to be registered in {cls.__name__}")
        if not issubclass(plugin, cls):
            raise TypeError(f"{plugin.__name__} must derive from {cls.__name__}")
        fields = {field.name for field in dataclasses.fields(candidate)}
        missing = [name for name in _declared(cls) if name not in fields]
        if missing:
            raise TypeError(f"{plugin.__name__} lacks the fields {', '.join(missing)}")
        name = plugin_name(plugin)
        known = cls._plugins.get(name)
        if known is not None and known is not plugin:
            raise TypeError(
                f"{plugin.__name__}: {cls.__name__} {name!r} is already {known.__qualname__}"
            )
        cls._plugins[name] = plugin
        return plugin

    @classmethod
    def plugins(cls) -> Mapping[str, builtins.type[PluginConfig]]:
        """The configurations registered in this family, by ``type``, sorted by it."""
        return types.MappingProxyType(dict(sorted(cls._plugins.items())))


_P = TypeVar("_P", bound=PluginConfig)


def plugin_name(plugin: type) -> str:
    """The ``type`` a plugin's configuration class declares (``Literal["name"]``)."""
    args = typing.get_args(typing.get_type_hints(plugin).get("type"))
    if len(args) != 1 or not isinstance(args[0], str):
        raise TypeError(f"{plugin.__name__} must declare its name as type: Literal['name']")
    return args[0]


def _declared(family: type) -> list[str]:
    """The attributes a family declares (and ``type``): every plugin has them as fields."""
    names: list[str] = []
    for klass in reversed(family.__mro__):
        if issubclass(klass, PluginConfig):
            names += [name for name in inspect.get_annotations(klass) if name[0] != "_"]
    return names


def _family_plugins(hint: Any) -> list[type] | None:
    """The plugins of ``hint`` when it is a :class:`PluginConfig` family, else None."""
    if isinstance(hint, type) and issubclass(hint, PluginConfig) and "_plugins" in vars(hint):
        return list(hint.plugins().values())
    return None


class Secret:
    """A secret resolved from its reference; its value is never shown in repr, logs or errors."""

    __slots__ = ("_value", "reference")

    def __init__(self, value: str, reference: str) -> None:
        self._value = value
        self.reference = reference

    def reveal(self) -> str:
        """The secret itself: only for the one place that needs it (a header, an API call)."""
        return self._value

    def __repr__(self) -> str:
        return f"Secret({self.reference})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other.reference == self.reference

    def __hash__(self) -> int:
        return hash(self.reference)


MAX_SECRET_FILE = 4096
"""Largest secret file read: a token or a password, never more (``/dev/zero`` must not be)."""


def resolve_secret(
    reference: str, *, base: Path | None = None, refuse_files: str | None = None
) -> Secret:
    """Resolve ``env:NAME`` or ``file:PATH`` (relative to ``base``); ValueError says why not.

    A secret file must be a regular file of at most :data:`MAX_SECRET_FILE` bytes (a FIFO or a
    device is refused without being read). With ``refuse_files``, a ``file:`` reference is
    refused with that reason before anything is read (references from API bodies).
    """
    kind, _, target = reference.partition(":")
    if kind == "env" and target:
        value = os.environ.get(target)
        if value is None:
            raise ValueError(f"environment variable {target} is not set")
        if not value.strip():
            raise ValueError(f"environment variable {target} is empty")
        return Secret(value.strip(), reference)
    if kind == "file" and target and refuse_files is not None:
        raise ValueError(refuse_files)
    if kind == "file" and target:
        path = Path(target)
        if base is not None and not path.is_absolute():
            path = base / path
        try:
            value = read_regular_file(path, MAX_SECRET_FILE).decode("utf-8").strip()
        except OSError as exc:
            raise ValueError(f"cannot read {path}: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise ValueError(f"{path} is not UTF-8 text") from None
        if not value:
            raise ValueError(f"{path} is empty")
        return Secret(value, reference)
    raise ValueError("a secret must be a reference, env:NAME or file:PATH, never the value itself")


class FileReference:
    """A file a component opens by its path (``ssl`` reads certificates and keys from files, not
    from memory), written ``file:PATH``. Resolving it checks that it is a regular file the
    process can read, without reading it; what is in it is checked by whoever uses it."""

    __slots__ = ("path", "reference")

    def __init__(self, path: Path, reference: str) -> None:
        self.path = path
        self.reference = reference

    def __fspath__(self) -> str:
        return str(self.path)

    def __repr__(self) -> str:
        return f"FileReference({self.reference})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FileReference) and other.reference == self.reference

    def __hash__(self) -> int:
        return hash(self.reference)


def resolve_file_reference(
    reference: str, *, base: Path | None = None, refuse_files: str | None = None
) -> FileReference:
    """Resolve ``file:PATH`` (relative to ``base``) to a readable regular file; ValueError says
    why not. With ``refuse_files``, refused with that reason before the file is looked at."""
    kind, _, target = reference.partition(":")
    if kind != "file" or not target:
        raise ValueError(f"must be a file reference, file:PATH, not {reference!r}")
    if refuse_files is not None:
        raise ValueError(refuse_files)
    path = Path(target)
    if base is not None and not path.is_absolute():
        path = base / path
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            raise ValueError(f"{path} is not a regular file")
        with path.open("rb"):  # readable by this process (a FIFO was refused above)
            pass
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from None
    return FileReference(path, reference)


def setting(
    default: Any = dataclasses.MISSING,
    *,
    help: str,
    min: float | None = None,
    max: float | None = None,
    default_factory: Any = dataclasses.MISSING,
) -> Any:
    """A dataclass field with bounds and help text for the reference documentation."""
    metadata = {"help": help, "min": min, "max": max}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def default_of(schema: type, name: str) -> Any:
    """The default of field ``name`` of the dataclass ``schema``: a command-line option takes
    its default from here, so that it is declared once, in the settings it fills."""
    for item in dataclasses.fields(schema):
        if item.name == name:
            if item.default is not dataclasses.MISSING:
                return item.default
            if item.default_factory is not dataclasses.MISSING:
                return item.default_factory()
            raise ValueError(f"{schema.__name__}.{name} has no default")
    raise ValueError(f"{schema.__name__} has no field {name!r}")


# -- settings built in code -------------------------------------------------------------------


def problems_of(instance: object) -> list[str]:
    """Every problem of a settings dataclass built in code (not by :func:`load_config`).

    The rules :func:`build_config` applies to a document, applied to an instance: each field's
    :func:`setting` bounds (a float must also be finite), then ``config_problems()``, through
    nested dataclasses (alone, in tuples, in mappings), each problem as ``"path: message"`` in the
    builder's words (``nodes[1].port: must be at most 65535, not 70000``). Unlike the builder,
    which has no instance to ask while a field is wrong, it runs ``config_problems`` even when a
    bound is broken, so that every problem is listed at once. Types are left to mypy; an empty
    list means the instance is valid.
    """
    problems: list[str] = []
    _collect_problems(instance, "", problems)
    return problems


def checked(instance: _T, what: str | None = None) -> _T:
    """``instance`` itself when :func:`problems_of` finds nothing, else :class:`ConfigError`
    (titled ``what``, by default the class's name) listing every problem.

    The one way to guarantee that settings built in code are valid, where they are built or
    where a component takes them: ``config = checked(NodeAgentConfig(...), "node agent")``.
    """
    problems = problems_of(instance)
    if problems:
        raise ConfigError(what or type(instance).__name__, problems)
    return instance


def _collect_problems(value: object, path: str, problems: list[str]) -> None:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        nested = _nested_fields(type(value))
        for item in dataclasses.fields(value):
            where = f"{path}.{item.name}" if path else item.name
            field_value = getattr(value, item.name)
            if problem := _bounds_problem(field_value, item.metadata):
                problems.append(f"{where}: {problem}")
            elif item.name in nested:
                _collect_problems(field_value, where, problems)
        rules = getattr(value, "config_problems", None)
        if callable(rules):
            problems.extend(f"{path}: {problem}" if path else problem for problem in rules())
    elif isinstance(value, tuple | list):
        for index, item in enumerate(value):
            _collect_problems(item, f"{path}[{index}]", problems)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            _collect_problems(item, f"{path}.{key}", problems)


def _bounds_problem(value: object, meta: Mapping[str, Any]) -> str | None:
    """The builder's bound checks (:meth:`_Builder.bounded`), for a value built in code."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a number, not {value!r}"
    low, high = meta.get("min"), meta.get("max")
    if low is not None and value < low:
        return f"must be at least {low}, not {value}"
    if high is not None and value > high:
        return f"must be at most {high}, not {value}"
    return None


@functools.cache
def _nested_fields(cls: type) -> frozenset[str]:
    """The fields of ``cls`` that may hold dataclasses, the only ones worth walking into (a
    dispatch table's 65,536 buckets of strings are not)."""
    hints = typing.get_type_hints(cls)
    return frozenset(item.name for item in dataclasses.fields(cls) if not _plain(hints[item.name]))


def _plain(hint: Any) -> bool:
    """Whether ``hint`` holds only values without fields of their own (numbers, strings,
    secrets, enums, literals, and tuples, mappings and unions of them)."""
    if typing.get_origin(hint) is typing.Literal:
        return True
    args = typing.get_args(hint)
    if args:
        return all(arg is Ellipsis or _plain(arg) for arg in args)
    if hint in (str, int, float, bool, type(None), Secret, FileReference):
        return True
    return isinstance(hint, type) and issubclass(hint, enum.Enum)


# -- building ---------------------------------------------------------------------------------


class _Builder:
    def __init__(self, source: str, base: Path | None, refuse_files: str | None = None) -> None:
        self.source = source
        self.base = base
        self.refuse_files = refuse_files
        self.problems: list[str] = []
        self._scalars = _yaml().constructor.SafeConstructor()

    def fail(self, node: yaml.Node | None, path: str, message: str) -> None:
        where = self.source
        if node is not None:
            where += f", line {node.start_mark.line + 1}"
        self.problems.append(f"{where}: {path}: {message}" if path else f"{where}: {message}")

    def scalar(self, node: yaml.Node) -> Any:
        return self._scalars.construct_object(node, deep=True)

    def build(self, hint: Any, node: yaml.Node, path: str, meta: Mapping[str, Any]) -> Any:
        origin = typing.get_origin(hint)
        args = typing.get_args(hint)
        if origin in (typing.Union, types.UnionType):
            options = [arg for arg in args if arg is not type(None)]
            is_null = isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null"
            if is_null and len(options) < len(args):
                return None
            if len(options) == 1:
                return self.build(options[0], node, path, meta)
            return self.tagged(options, node, path)
        plugins = _family_plugins(hint)
        if plugins is not None:
            return self.tagged(plugins, node, path)
        if dataclasses.is_dataclass(hint) and isinstance(hint, type):
            return self.dataclass(hint, node, path)
        if origin is tuple:
            if not isinstance(node, yaml.SequenceNode):
                self.fail(node, path, "must be a list")
                return ()
            item = args[0]
            built = [
                self.build(item, child, f"{path}[{i}]", {}) for i, child in enumerate(node.value)
            ]
            return tuple(built)
        if origin in (Mapping, dict, typing.Mapping):
            if not isinstance(node, yaml.MappingNode):
                self.fail(node, path, "must be a mapping")
                return types.MappingProxyType({})
            result = {}
            for key_node, value_node in self.pairs(node, path):
                key = str(self.scalar(key_node))
                result[key] = self.build(args[1], value_node, f"{path}.{key}", {})
            return types.MappingProxyType(result)
        if origin is typing.Literal:
            value = self.scalar(node) if isinstance(node, yaml.ScalarNode) else None
            if value not in args:
                allowed = ", ".join(str(arg) for arg in args)
                self.fail(node, path, f"must be one of {allowed}, not {value!r}")
            return value
        if not isinstance(node, yaml.ScalarNode):
            self.fail(
                node,
                path,
                f"must be a single value ({_describe(hint)}), not a "
                f"{'list' if isinstance(node, yaml.SequenceNode) else 'mapping'}",
            )
            return None
        value = self.scalar(node)
        return self.value(hint, value, node, path, meta)

    def value(
        self, hint: Any, value: Any, node: yaml.Node, path: str, meta: Mapping[str, Any]
    ) -> Any:
        if hint is Secret:
            if not isinstance(value, str):
                self.fail(node, path, "must be a secret reference, env:NAME or file:PATH")
                return None
            try:
                return resolve_secret(value, base=self.base, refuse_files=self.refuse_files)
            except ValueError as exc:
                self.fail(node, path, str(exc))
                return None
        if hint is FileReference:
            if not isinstance(value, str):
                self.fail(node, path, "must be a file reference, file:PATH")
                return None
            try:
                return resolve_file_reference(value, base=self.base, refuse_files=self.refuse_files)
            except ValueError as exc:
                self.fail(node, path, str(exc))
                return None
        if isinstance(hint, type) and issubclass(hint, enum.Enum):
            try:
                return hint(value)
            except ValueError:
                allowed = ", ".join(str(member.value) for member in hint)
                self.fail(node, path, f"must be one of {allowed}, not {value!r}")
                return None
        if hint is bool:
            if not isinstance(value, bool):
                self.fail(node, path, f"must be true or false, not {value!r}")
                return None
            return value
        if hint is int:
            if isinstance(value, bool) or not isinstance(value, int):
                self.fail(node, path, f"must be an integer, not {value!r}")
                return None
            return self.bounded(value, node, path, meta)
        if hint is float:
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
            ):
                self.fail(node, path, f"must be a number, not {value!r}")
                return None
            return self.bounded(float(value), node, path, meta)
        if hint is str:
            if not isinstance(value, str) or not value:
                self.fail(node, path, f"must be a non-empty string, not {value!r}")
                return None
            return value
        raise TypeError(f"config schema uses an unsupported type {hint!r} at {path}")

    def bounded(self, value: float, node: yaml.Node, path: str, meta: Mapping[str, Any]) -> Any:
        low, high = meta.get("min"), meta.get("max")
        if low is not None and value < low:
            self.fail(node, path, f"must be at least {low}, not {value}")
            return None
        if high is not None and value > high:
            self.fail(node, path, f"must be at most {high}, not {value}")
            return None
        return value

    def pairs(self, node: yaml.MappingNode, path: str) -> list[tuple[yaml.Node, yaml.Node]]:
        seen: set[str] = set()
        result = []
        for key_node, value_node in node.value:
            key = str(self.scalar(key_node))
            if key in seen:
                self.fail(key_node, f"{path}.{key}" if path else key, "duplicate key")
                continue
            seen.add(key)
            result.append((key_node, value_node))
        return result

    def dataclass(self, cls: type[_T], node: yaml.Node, path: str) -> _T | None:
        if isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null":
            node = yaml.MappingNode("tag:yaml.org,2002:map", [], node.start_mark, node.end_mark)
        if not isinstance(node, yaml.MappingNode):
            self.fail(node, path, "must be a mapping")
            return None
        hints = typing.get_type_hints(cls)
        fields = {field.name: field for field in dataclasses.fields(cls) if field.init}  # type: ignore[arg-type]
        values: dict[str, Any] = {}
        before = len(self.problems)
        for key_node, value_node in self.pairs(node, path):
            key = str(self.scalar(key_node))
            where = f"{path}.{key}" if path else key
            if key not in fields:
                self.fail(key_node, where, "unknown key" + _suggestion(key, fields))
                continue
            field = fields[key]
            values[key] = self.build(hints[key], value_node, where, field.metadata)
        for name, field in fields.items():
            required = (
                field.default is dataclasses.MISSING
                and field.default_factory is dataclasses.MISSING
            )
            if name not in values and required:
                self.fail(node, f"{path}.{name}" if path else name, "missing")
        if len(self.problems) > before:
            return None
        instance = cls(**values)
        rules = getattr(instance, "config_problems", None)
        if callable(rules):
            for problem in rules():
                self.fail(node, path, problem)
        return instance

    def tagged(self, options: list[Any], node: yaml.Node, path: str) -> Any:
        """A union of dataclasses told apart by their ``type`` field."""
        by_type: dict[Any, Any] = {}
        for option in options:
            type_hint = typing.get_type_hints(option).get("type")
            for name in typing.get_args(type_hint):
                by_type[name] = option
        if not isinstance(node, yaml.MappingNode):
            self.fail(node, path, "must be a mapping with a type")
            return None
        type_value = None
        for key_node, value_node in node.value:
            if self.scalar(key_node) == "type" and isinstance(value_node, yaml.ScalarNode):
                type_value = self.scalar(value_node)
        if type_value not in by_type:
            allowed = ", ".join(sorted(str(name) for name in by_type)) or "(none registered)"
            self.fail(
                node,
                f"{path}.type" if path else "type",
                f"must be one of {allowed}, not {type_value!r}",
            )
            return None
        return self.dataclass(by_type[type_value], node, path)


def _suggestion(key: str, known: Iterable[str]) -> str:
    import difflib  # noqa: PLC0415

    close = difflib.get_close_matches(key, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _describe(hint: Any) -> str:
    return getattr(hint, "__name__", str(hint))


def parse_config(
    text: str,
    schema: type[_T],
    *,
    source: str = "<config>",
    base: Path | None = None,
    refuse_files: str | None = None,
) -> _T:
    """Build ``schema`` from YAML ``text``; raises :class:`ConfigError` with every problem.

    ``refuse_files``: ``file:`` secret references are refused, with this reason, before
    anything is read (documents from the API)."""
    node = compose_config(text, source=source)
    return build_config(node, schema, source=source, base=base, refuse_files=refuse_files)


def compose_config(text: str, *, source: str = "<config>") -> yaml.MappingNode:
    """Parse YAML ``text`` into nodes that keep their lines (an empty document is an empty
    mapping), for callers that combine documents before building; :class:`ConfigError` when the
    text is not YAML."""
    try:
        node = _yaml().compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}, line {mark.line + 1}" if mark is not None else source
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(
            "invalid configuration", [f"{where}: not valid YAML: {problem}"]
        ) from None
    if node is None:
        start = yaml.Mark(source, 0, 0, 0, "", 0)
        return yaml.MappingNode("tag:yaml.org,2002:map", [], start, start)
    if not isinstance(node, yaml.MappingNode):
        line = node.start_mark.line + 1
        raise ConfigError("invalid configuration", [f"{source}, line {line}: must be a mapping"])
    return node


def build_config(
    node: yaml.Node,
    schema: type[_T],
    *,
    source: str = "<config>",
    base: Path | None = None,
    refuse_files: str | None = None,
) -> _T:
    """Build ``schema`` from composed YAML ``node``; raises :class:`ConfigError` with every
    problem, each with ``source`` and its line."""
    builder = _Builder(source, base, refuse_files)
    result = builder.dataclass(schema, node, "")
    if builder.problems or result is None:
        raise ConfigError("invalid configuration", sorted(builder.problems, key=_line_of))
    return result


def _line_of(problem: str) -> int:
    """The line a problem names (problems keep document order; stable for equal lines)."""
    _, found, rest = problem.partition(", line ")
    digits = rest.split(":", 1)[0]
    return int(digits) if found and digits.isdigit() else 0


def load_config(path: str | os.PathLike[str], schema: type[_T]) -> _T:
    """Read and build a configuration file; ``file:`` secrets are relative to its directory."""
    file = Path(path)
    try:
        text = file.read_text()
    except OSError as exc:
        raise ConfigError(
            "invalid configuration", [f"{file}: cannot read: {exc.strerror}"]
        ) from None
    return parse_config(text, schema, source=str(file), base=file.resolve().parent)


def to_document(value: Any) -> Any:
    """A built configuration as a JSON-ready document that :func:`parse_config` reads back.

    Secrets become their references, enums their values, tuples lists; never a secret's value.
    """
    if isinstance(value, Secret | FileReference):
        return value.reference
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            field.name: to_document(getattr(value, field.name))
            for field in dataclasses.fields(value)
        }
    if isinstance(value, tuple | list):
        return [to_document(item) for item in value]
    if isinstance(value, Mapping):
        return {str(key): to_document(item) for key, item in value.items()}
    return value


def dump_config(instance: object) -> str:
    """YAML text that :func:`parse_config` builds back into an equal ``instance``.

    Secrets are written as their references (never their values); a ``file:`` reference that
    is relative resolves against the directory of the file the text is written to.
    """
    if not dataclasses.is_dataclass(instance) or isinstance(instance, type):
        raise TypeError(f"dump_config takes a dataclass instance, not {instance!r}")
    text: str = _yaml().safe_dump(to_document(instance), sort_keys=False, default_flow_style=False)
    return text


# -- documentation ----------------------------------------------------------------------------


def reference(schema: type, *, title: str | None = None) -> str:
    """Markdown tables documenting every field of ``schema`` and the dataclasses it holds."""
    sections: list[str] = []
    seen: set[type] = set()

    def document(cls: type, heading: str) -> None:
        if cls in seen:
            return
        seen.add(cls)
        hints = typing.get_type_hints(cls)
        rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
        nested: list[tuple[type, str]] = []
        for field in dataclasses.fields(cls):
            hint = hints[field.name]
            rows.append(
                f"| `{field.name}` | {_type_text(hint)} | {_default_text(field)} | "
                f"{field.metadata.get('help', '')}{_bounds_text(field.metadata)} |"
            )
            for inner in _dataclasses_in(hint):
                nested.append((inner, f"`{field.name}`: {inner.__name__}"))
        doc = (cls.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
        sections.append(f"### {heading}\n\n{doc}\n\n" + "\n".join(rows))
        for inner, inner_heading in nested:
            document(inner, inner_heading)

    document(schema, title or schema.__name__)
    return "\n\n".join(sections) + "\n"


def _dataclasses_in(hint: Any) -> list[type]:
    plugins = _family_plugins(hint)
    if plugins is not None:
        return plugins
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return [hint]
    found: list[type] = []
    for arg in typing.get_args(hint):
        found += _dataclasses_in(arg)
    return found


def _type_text(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_text(arg) for arg in args if arg is not type(None)) + (
            " or null" if type(None) in args else ""
        )
    plugins = _family_plugins(hint)
    if plugins is not None:
        return " or ".join(_type_text(plugin) for plugin in plugins)
    if origin is tuple:
        return f"list of {_type_text(args[0])}"
    if origin in (Mapping, dict):
        return f"mapping of {_type_text(args[1])}"
    if origin is typing.Literal:
        return " \\| ".join(f"`{arg}`" for arg in args)
    if hint is Secret:
        return "secret (`env:NAME` or `file:PATH`)"
    if hint is FileReference:
        return "file (`file:PATH`)"
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return " \\| ".join(f"`{member.value}`" for member in hint)
    return getattr(hint, "__name__", str(hint))


def _default_text(field: dataclasses.Field[Any]) -> str:
    if field.default is not dataclasses.MISSING:
        value = field.default
        if isinstance(value, enum.Enum):
            value = value.value
        return "null" if value is None else f"`{value}`"
    if field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
        if dataclasses.is_dataclass(value):
            return "(all defaults)"
        return "empty" if not value else f"`{value}`"
    return "required"


def _bounds_text(meta: Mapping[str, Any]) -> str:
    low, high = meta.get("min"), meta.get("max")
    if low is None and high is None:
        return ""
    if high is None:
        return f" (at least {low})"
    if low is None:
        return f" (at most {high})"
    return f" ({low} to {high})"


# -- JSON Schema ------------------------------------------------------------------------------

SECRET_PATTERN = "^(env|file):.+$"  # noqa: S105 (a reference's shape, not a secret)
FILE_PATTERN = "^file:.+$"


def json_schema(schema: type) -> dict[str, Any]:
    """A JSON Schema (draft 2020-12, as OpenAPI 3.1 uses) of the documents that build ``schema``.

    It states what :func:`parse_config` checks key by key: types, bounds, required and unknown
    keys, enum values, secret references, plugins told apart by ``type``. Rules across fields
    (``config_problems``) and facts outside the document (which zones exist) are checked only
    when the document is built, so a document valid against this schema may still be refused.
    """
    return _schema_of(schema, {})


def _schema_of(hint: Any, meta: Mapping[str, Any]) -> dict[str, Any]:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        options = [arg for arg in args if arg is not type(None)]
        if len(options) == 1:
            inner = _schema_of(options[0], meta)
        else:
            inner = {"oneOf": [_tagged_schema(option) for option in options]}
        if len(options) < len(args):
            return {"anyOf": [inner, {"type": "null"}]}
        return inner
    plugins = _family_plugins(hint)
    if plugins is not None:
        return {"oneOf": [_tagged_schema(plugin) for plugin in plugins]}
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return _dataclass_schema(hint)
    if origin is tuple:
        return {"type": "array", "items": _schema_of(args[0], {})}
    if origin in (Mapping, dict):
        return {"type": "object", "additionalProperties": _schema_of(args[1], {})}
    if origin is typing.Literal:
        return {"enum": list(args)}
    if hint is Secret:
        return {"type": "string", "pattern": SECRET_PATTERN}
    if hint is FileReference:
        return {"type": "string", "pattern": FILE_PATTERN}
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return {"type": "string", "enum": [member.value for member in hint]}
    if hint is bool:
        return {"type": "boolean"}
    if hint is int:
        return _bounded({"type": "integer"}, meta)
    if hint is float:
        return _bounded({"type": "number"}, meta)
    if hint is str:
        return {"type": "string", "minLength": 1}
    raise TypeError(f"config schema uses an unsupported type {hint!r}")


def _bounded(schema: dict[str, Any], meta: Mapping[str, Any]) -> dict[str, Any]:
    if meta.get("min") is not None:
        schema["minimum"] = meta["min"]
    if meta.get("max") is not None:
        schema["maximum"] = meta["max"]
    return schema


def _dataclass_schema(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for field in dataclasses.fields(cls):
        if not field.init:
            continue
        prop = _schema_of(hints[field.name], field.metadata)
        if field.metadata.get("help"):
            prop["description"] = field.metadata["help"]
        if field.default is not dataclasses.MISSING:
            prop["default"] = to_document(field.default)
        elif field.default_factory is not dataclasses.MISSING:
            prop["default"] = to_document(field.default_factory())
        else:
            required.append(field.name)
        properties[field.name] = prop
    result: dict[str, Any] = {
        "title": cls.__name__,
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
    }
    doc = (cls.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
    if doc:
        result["description"] = doc
    if required:
        result["required"] = required
    return result


def _tagged_schema(option: Any) -> dict[str, Any]:
    """One option of a union told apart by ``type``: its ``type`` must be written."""
    result = _schema_of(option, {})
    if "type" in result.get("properties", {}) and "type" not in result.get("required", []):
        result["required"] = ["type", *result.get("required", [])]
    return result
