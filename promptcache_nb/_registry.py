"""One registry class for every pluggable component: strategies, cache models, log readers.

A :class:`Registry` maps names to components in registration order. The built-in components register when
their package is imported; a third-party package plugs in through an ``importlib.metadata`` entry point in the
registry's group (``promptcache_nb.strategies``, ``promptcache_nb.cache_models``, ``promptcache_nb.readers``),
loaded on the first lookup, so ``import promptcache_nb`` stays as fast as it was and the CLI sees the plugin
(llm's plugin hooks)::

    # the plugin's pyproject.toml
    [project.entry-points."promptcache_nb.strategies"]
    my_strategy = "my_package:MyStrategy"

The entry point names the component (a class, or for readers a class or an instance); it is registered under
its own ``name`` attribute, after the built-ins, and never replaces a component already registered under that
name (a plugin adds names; :meth:`Registry.register` in code may still replace one deliberately).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Mapping
from importlib.metadata import entry_points
from typing import Any, Generic, TypeVar

from ._util import user_stacklevel
from .errors import PluginWarning, PromptCacheError

T = TypeVar("T")


class Registry(Mapping[str, T], Generic[T]):
    """Components by name, in registration order; entry points of ``group`` join on the first lookup.

    Args:
        kind: what the components are, for messages (``"strategy"``).
        group: the entry-point group plugins register in.
        unknown: builds the error an unknown name raises, from the name and the valid names.
        prepare: turns what an entry point loads into a component (e.g. instantiates a reader class).
    """

    def __init__(self, kind: str, group: str, *, unknown: Callable[[str, list[str]], Exception],
                 prepare: Callable[[Any], T] | None = None) -> None:
        self.kind = kind
        self.group = group
        self._unknown = unknown
        self._prepare = prepare
        self._items: dict[str, T] = {}
        self._plugins_loaded = False

    def register(self, component: T, *, name: str | None = None) -> T:
        """Add ``component`` under ``name`` (default: its ``name`` attribute), replacing one of that name;
        returns it, so this also works as a class decorator."""
        key = name if name is not None else getattr(component, "name", None)
        if not isinstance(key, str) or not key:
            raise TypeError(f"a {self.kind} needs a non-empty str `name` to be registered, got {key!r}")
        self._items[key] = component
        return component

    def lookup(self, name: str) -> T:
        """The component registered as ``name``; raises the registry's one-line error listing the valid names."""
        try:
            return self[name]
        except KeyError:
            raise self._unknown(name, list(self._items)) from None

    def names(self) -> tuple[str, ...]:
        """Every registered name, in registration order (built-ins first, then plugins)."""
        self._load_plugins()
        return tuple(self._items)

    def __getitem__(self, name: str) -> T:
        # a name already registered needs no plugin: entry points never replace one, so the answer is the same
        # before and after they load (and the package's own import-time lookups never import a plugin, which
        # would import the half-initialised package)
        component = self._items.get(name)
        if component is None:
            self._load_plugins()
            component = self._items[name]
        return component

    def __iter__(self) -> Iterator[str]:
        self._load_plugins()
        return iter(list(self._items))

    def __len__(self) -> int:
        self._load_plugins()
        return len(self._items)

    def __repr__(self) -> str:
        return f"<Registry {self.group}: {', '.join(self._items)}>"

    def _load_plugins(self) -> None:
        if self._plugins_loaded:
            return
        self._plugins_loaded = True  # first: a plugin that looks names up while it loads sees the built-ins
        for ep in sorted(entry_points(group=self.group), key=lambda e: e.name):
            try:
                loaded = ep.load()
                component = self._prepare(loaded) if self._prepare is not None else loaded
                name = getattr(component, "name", None)
                if name in self._items and self._items[name] is not component:
                    raise TypeError(f"a {self.kind} named {name!r} is already registered ({self._items[name]!r})")
                self.register(component)
            except (ImportError, AttributeError, TypeError, PromptCacheError) as exc:
                warnings.warn(PluginWarning(f"{self.kind} plugin {ep.name!r} ({ep.value}) could not be loaded: "
                                            f"{type(exc).__name__}: {exc}"), stacklevel=user_stacklevel())


__all__ = ["Registry"]
