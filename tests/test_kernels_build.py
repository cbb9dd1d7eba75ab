"""kernels/build.py by hand (python kernels/build.py) names the module as pip install does: _kernels.abi3.so
(cffi's setuptools hook asks for the stable ABI; the by-hand build asks for it itself), so the importer never
finds a second, stale _kernels.cpython-3XX-*.so beside it (which it would prefer)."""
import importlib.util
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _builder():
    spec = importlib.util.spec_from_file_location("_orkpack_kernels_build", ROOT / "kernels" / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.ffibuilder


@pytest.mark.skipif(hasattr(sys, "gettotalrefcount") or bool(sysconfig.get_config_var("Py_GIL_DISABLED")),
                    reason="a debug or free-threaded CPython has no stable ABI for cffi")
def test_by_hand_build_asks_for_the_stable_abi():
    module, _, _, kwds = _builder()._assigned_source
    assert module == "orkpack._kernels" and kwds.get("py_limited_api") is True
    import orkpack._kernels as k
    assert Path(k.__file__).name == "_kernels.abi3.so"
