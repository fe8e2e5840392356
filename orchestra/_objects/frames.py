"""DataFrames read from pandas streams, made from the columns' buffers directly.

pyarrow's ``Table.to_pandas`` rebuilds the column index from the schema's pandas metadata
on every call (JSON, string inference: ~350 of its ~1,000 us with the caches cold, as
right after a large put) and walks its extension-type machinery even where every column
is a plain number. What it makes of a schema does not change, so the first conversion of
each schema in a process is pyarrow's own, and it is learnt from: when every column came
back as a numpy view of its Arrow buffer (numbers without nulls, not float16) and the
index is a range, later tables of that schema are made the same way by hand, one block
per column over the same memory (``split_blocks=True``), with a copy of the learnt
column index and a new RangeIndex. Anything else (strings, booleans, nulls, a stored
index, pandas before 3, which lacks ``create_dataframe_from_blocks``) takes pyarrow's
path every time.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd
    import pyarrow as pa

_PANDAS = b"pandas"   # the schema's metadata key pyarrow writes for a DataFrame


class Template:
    """What to_pandas made of one schema: the column index, each column's Arrow type id
    and numpy dtype, and the range index's description (None: RangeIndex(rows))."""

    __slots__ = ("columns", "type_ids", "dtypes", "index")

    def __init__(self, columns: pd.Index, type_ids: list[int], dtypes: list[np.dtype],
                 index: dict[str, Any] | None) -> None:
        self.columns = columns
        self.type_ids = type_ids
        self.dtypes = dtypes
        self.index = index


class Ready:
    """A table's columns as numpy views, its template and its range: build() makes the
    DataFrame from them."""

    __slots__ = ("template", "arrays", "index")

    def __init__(self, template: Template, arrays: list[np.ndarray],
                 index: tuple[int, int, int, Any]) -> None:
        self.template = template
        self.arrays = arrays
        self.index = index   # RangeIndex (start, stop, step, name)


# The schema's pandas metadata -> its Template, or None: not made by hand. Bounded: a
# process seeing more schemas converts the others with pyarrow. Any thread adds to it
# (one dict operation; two threads converting one schema learn the same template).
_TEMPLATES: dict[bytes, Template | None] = {}
_TEMPLATES_MAX = 64


def ready(table: pa.Table) -> Ready | None:
    """The makings of ``table``'s DataFrame, when its schema's template is known and the
    table fits it (one chunk per column, no nulls); None otherwise."""
    meta = table.schema.metadata
    template = _TEMPLATES.get(meta.get(_PANDAS, b"")) if meta else None
    if template is None or table.num_columns != len(template.dtypes):
        return None
    import numpy as np
    rows = table.num_rows
    index = template.index
    if index is None:
        span = (0, rows, 1, None)
    else:
        span = (index["start"], index["stop"], index["step"], index["name"])
        if len(range(*span[:3])) != rows:
            return None   # pyarrow drops such an index: its own path decides
    arrays = []
    for column, type_id, dtype in zip(table.columns, template.type_ids, template.dtypes, strict=True):
        if column.num_chunks != 1:
            return None
        chunk = column.chunk(0)
        if chunk.type.id != type_id or chunk.null_count:
            return None
        data = chunk.buffers()[1]
        if data is None:
            return None
        arrays.append(np.frombuffer(data, dtype, rows, chunk.offset * dtype.itemsize))
    return Ready(template, arrays, span)


def build(ready: Ready) -> pd.DataFrame:
    """The DataFrame to_pandas(split_blocks=True) makes: a block per column, each a view
    of its column's buffer."""
    import numpy as np
    import pandas as pd
    from pandas.api.internals import create_dataframe_from_blocks
    start, stop, step, name = ready.index
    blocks = [(a.reshape(1, -1), np.array([i], dtype=np.intp)) for i, a in enumerate(ready.arrays)]
    return create_dataframe_from_blocks(blocks, index=pd.RangeIndex(start, stop, step, name=name),
                                        columns=ready.template.columns.copy())


def convert(table: pa.Table) -> tuple[pd.DataFrame, Ready | None]:
    """pyarrow's conversion of ``table``, its schema's template learnt from it, and the
    makings of the same DataFrame again (None when not made by hand)."""
    df = table.to_pandas(split_blocks=True, use_threads=False)
    meta = table.schema.metadata or {}
    key = meta.get(_PANDAS)
    if key is None:
        return df, None
    if key not in _TEMPLATES and len(_TEMPLATES) < _TEMPLATES_MAX:
        _TEMPLATES[key] = _template(table, key, df)
    return df, ready(table)


def _template(table: pa.Table, key: bytes, df: pd.DataFrame) -> Template | None:
    """A Template when ``df`` is what build() would make of ``table``: every column a
    numpy view of its Arrow buffer, a RangeIndex from the metadata, nothing else."""
    try:
        import numpy as np
        import pandas as pd
        import pyarrow as pa
        from pandas.api.internals import create_dataframe_from_blocks  # noqa: F401 - pandas 3
    except ImportError:
        return None
    if df.attrs or type(df.index) is not pd.RangeIndex or df.shape[1] != table.num_columns:
        return None
    try:
        indexes = json.loads(key).get("index_columns")
    except (ValueError, AttributeError):
        return None
    if indexes == []:
        index = None
    elif (isinstance(indexes, list) and len(indexes) == 1 and isinstance(indexes[0], dict)
          and indexes[0].get("kind") == "range"):
        index = indexes[0]
    else:
        return None
    type_ids, dtypes = [], []
    for i, column in enumerate(table.columns):
        t = column.type
        if not (pa.types.is_integer(t) or pa.types.is_float32(t) or pa.types.is_float64(t)) \
                or column.num_chunks != 1 or column.null_count:
            return None
        dtype = np.dtype(t.to_pandas_dtype())
        made = df.dtypes.iloc[i]
        if not isinstance(made, np.dtype) or made != dtype:
            return None   # an extension dtype (ArrowDtype), or another numpy one
        values = df.iloc[:, i].to_numpy()
        chunk = column.chunk(0)
        data = chunk.buffers()[1]
        if values.dtype != dtype or data is None \
                or values.ctypes.data != data.address + chunk.offset * dtype.itemsize:
            return None   # converted, not viewed: pyarrow's path stays
        type_ids.append(t.id)
        dtypes.append(dtype)
    return Template(df.columns, type_ids, dtypes, index)
