"""The C passes of :mod:`lightning_nvcomp.codec.planes` (``_planes.c``): addresses as integers, checked by the caller."""

def split(src: int, n: int, rotated: bool, /, *rows: int) -> None:
    """Split ``n`` numbers of ``len(rows)`` bytes at ``src`` into the rows (2 to 8), rotated as ``planes.rotate``
    does."""

def join(out: int, n: int, rotated: bool, op: int, /, *rows: int) -> None:
    """Join the rows of ``n`` bytes each back into ``n`` numbers at ``out``, the rotation undone; ``op`` 0 stores
    them, 1 XORs them into the numbers there, 2 adds them (wrapping, numbers of 2, 4 or 8 bytes)."""
