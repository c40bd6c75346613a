"""The stand-ins pymilvus gets for pandas and requests (memd.standins):
neither is imported until something uses it, and then the real one works for everyone. Each case
runs in a fresh interpreter (the stand-in is process-wide, and pytest may import pandas)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

PRELUDE = """
import sys
import memd.indexing  # installs the stand-in, as in every memd process
import pymilvus
from pymilvus.orm import schema, types

def pandas_imported():
    return any(name.startswith("pandas._libs") for name in sys.modules)
"""


def run(body: str) -> str:
    code = PRELUDE + textwrap.dedent(body)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_pymilvus_imports_without_pandas_and_its_dataframe_checks_need_none() -> None:
    run(
        """
        assert not pandas_imported() and "pandas" not in sys.modules
        assert isinstance(schema.pd.DataFrame, type)
        assert not isinstance([], schema.pd.DataFrame)
        assert schema.is_valid_insert_data([{"id": 1}])  # isinstance(data, (pd.DataFrame, ...))
        client_schema = pymilvus.MilvusClient.create_schema()
        client_schema.add_field("id", pymilvus.DataType.INT64, is_primary=True)
        import inspect
        inspect.getmodule(print)  # reads every module's __file__: no import
        assert not pandas_imported()
        """
    )


def test_a_type_helper_imports_the_real_pandas_and_everyone_gets_it_after() -> None:
    run(
        """
        assert types.is_list_like([1]) and not types.is_scalar([1])
        assert pandas_imported()
        import pandas as pd
        assert hasattr(pd, "__file__") and schema.pd.DataFrame is pd.DataFrame
        frame = pd.DataFrame({"id": [1, 2]})
        assert schema.is_valid_insert_data(frame) and schema.check_is_row_based(frame) is False
        assert schema.pd.__version__ == pd.__version__
        import pandas.io.formats.style  # a submodule pandas does not import itself
        """
    )


def test_a_pandas_imported_by_someone_else_is_what_pymilvus_sees_from_then_on() -> None:
    run(
        """
        import pandas as pd
        frame = pd.DataFrame({"id": [1]})
        assert schema.pd.DataFrame is pd.DataFrame and schema.is_valid_insert_data(frame)
        from pymilvus.orm.prepare import Prepare
        assert Prepare.prepare_data(frame, pymilvus.CollectionSchema(
            [pymilvus.FieldSchema("id", pymilvus.DataType.INT64, is_primary=True)]
        ))
        """
    )


def test_pyarrow_is_kept_from_importing_pandas_and_works_with_it_later() -> None:
    run(
        """
        import pyarrow as pa
        from memd import standins
        standins.keep_out_of_pyarrow()
        assert pa.array([1, None]).null_count == 1 and pa.array(["a"]).type == pa.string()
        assert pa.table({"a": [1.5]}).num_rows == 1 and not pandas_imported()
        import pandas as pd
        assert pa.array(pd.Series([1, None])).null_count == 1
        assert pa.table({"a": [1]}).to_pandas()["a"].tolist() == [1]
        """
    )


def test_pymilvus_imported_before_the_stand_in_keeps_the_real_pandas() -> None:
    code = (
        "import sys, pymilvus, memd.indexing\n"
        "from pymilvus.orm import schema\n"
        "import pandas\n"
        "assert schema.pd is pandas and hasattr(pandas, '__file__')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_requests_is_imported_when_pymilvus_uses_it_and_is_the_real_one_after() -> None:
    run(
        """
        import memsearch.cli, milvus_lite.db  # the zygote's other imports
        assert "requests" not in sys.modules and "urllib3" not in sys.modules
        from pymilvus.client import global_topology
        assert issubclass(global_topology.requests.exceptions.RequestException, OSError)
        import requests
        assert hasattr(requests, "__file__") and global_topology.requests.get is requests.get
        assert not pandas_imported()
        """
    )
