"""Class labels: the integer a prompt's ``label`` metadata holds, as a JSON number or as decimal text (a CSV
cell); a scorer that reads labels checks their range."""

from __future__ import annotations

import operator
import re
from typing import Any

_DECIMAL = re.compile(r"\s*[0-9]+\s*")


def integer_label(value: Any) -> int:
    """``value`` as a non-negative integer: an integer, or its decimal text.

    Booleans, fractions (``1.9``, also ``1.0``) and anything else raise ``ValueError`` saying why.
    """
    if isinstance(value, str) and _DECIMAL.fullmatch(value):
        return int(value)
    if isinstance(value, bool):
        raise ValueError(f"label {value!r} is a boolean, not an integer")
    try:
        label = operator.index(value)
    except TypeError:
        raise ValueError(f"label {value!r} is not an integer") from None
    if label < 0:
        raise ValueError(f"label {value!r} is negative; labels are 0, 1, 2, ...")
    return label
