"""The one walk over a state's containers (:func:`leaves`): the writer's tensor names, the DCP writer's local
shards, the CLI's listing and the benchmarks' comparisons all see the same tensors in the same order."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any


def leaves(
    obj: object, accept: Callable[[object], bool], *, sort_keys: bool = False, once: bool = True
) -> Iterator[tuple[str, Any]]:
    """Each item of ``obj`` that ``accept`` takes, found through dicts (any mapping), lists and tuples, depth first
    in their order, with its dotted path (``"optimizer.state.0.exp_avg"``; ``"<root>"`` for ``obj`` itself).

    Args:
        obj: the state to walk; a container reached twice (or through itself) is walked once.
        accept: which items are leaves; an accepted item is not walked into, even if it is a container.
        sort_keys: visit mapping keys in sorted order (by ``str``) instead of insertion order, so two states built in
            different orders give their leaves in the same order.
        once: yield an item reached through several paths once, at the first; ``False`` yields it at every path.
    """
    seen: set[int] = set()
    stack: list[tuple[object, str]] = [(obj, "")]
    while stack:
        item, path = stack.pop()
        if accept(item):
            if not once or id(item) not in seen:
                seen.add(id(item))
                yield path or "<root>", item
        elif isinstance(item, (Mapping, list, tuple)) and id(item) not in seen:
            seen.add(id(item))
            if isinstance(item, Mapping):
                keys = sorted(item, key=str) if sort_keys else list(item)
                pairs = [(item[key], key) for key in keys]
            else:
                pairs = [(value, index) for index, value in enumerate(item)]
            stack.extend((value, f"{path}.{key}" if path else str(key)) for value, key in reversed(pairs))
