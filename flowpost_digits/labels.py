"""Digit labels: the class 0-9 that ``digit_adherence`` and the judge read from a prompt's ``label`` metadata."""

from __future__ import annotations

from typing import Any

from flowpost.core.labels import integer_label

DIGITS = range(10)


def digit_label(value: Any) -> int:
    """``value`` as a digit 0-9: an integer, or its decimal text (a CSV cell).

    Booleans, fractions (``1.9``, also ``1.0``), other numbers and anything else raise ``ValueError`` saying why.
    """
    label = integer_label(value)
    if label not in DIGITS:
        raise ValueError(f"label {value!r} is out of range; digits are 0-9")
    return label
