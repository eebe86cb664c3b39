"""Digit labels: the class 0-9 that ``digit_adherence`` reads from a prompt's ``label`` metadata."""

from __future__ import annotations

import operator
import re
from typing import Any

DIGITS = range(10)
_DECIMAL = re.compile(r"\s*[0-9]+\s*")


def digit_label(value: Any) -> int:
    """``value`` as a digit 0-9: an integer, or its decimal text (a CSV cell).

    Booleans, fractions (``1.9``, also ``1.0``) and anything else raise ``ValueError`` saying why.
    """
    if isinstance(value, str) and _DECIMAL.fullmatch(value):
        label = int(value)
    elif isinstance(value, bool):
        raise ValueError(f"label {value!r} is a boolean, not a digit 0-9")
    else:
        try:
            label = operator.index(value)
        except TypeError:
            raise ValueError(f"label {value!r} is not an integer digit 0-9") from None
    if label not in DIGITS:
        raise ValueError(f"label {value!r} is out of range; digits are 0-9")
    return label
