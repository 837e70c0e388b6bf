"""runtime/rlcli_lazy_torch.py's stand-in module, on a throwaway package (no torch, no SkyRL)."""

from __future__ import annotations

import importlib
import importlib.util
import sys

from rlcli.server import commands


def _module():
    spec = importlib.util.spec_from_file_location("rlcli_lazy_torch_under_test",
                                                  commands.RUNTIME_DIR / "rlcli_lazy_torch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_deferred_module_imports_on_first_use_only(tmp_path, monkeypatch):
    pkg = tmp_path / "heavy_pkg_for_test"
    pkg.mkdir()
    (tmp_path / "loads.txt").write_text("")
    (pkg / "__init__.py").write_text(f"open({str(tmp_path / 'loads.txt')!r}, 'a').write('x')\nVALUE = 42\n")
    (pkg / "sub.py").write_text("OTHER = 7\n")
    (tmp_path / "user_mod_for_test.py").write_text("import heavy_pkg_for_test\n\ndef use():\n"
                                                   "    return heavy_pkg_for_test.VALUE\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    lazy = _module()
    try:
        assert lazy.defer("heavy_pkg_for_test") is True
        assert lazy.defer("heavy_pkg_for_test") is False  # already in sys.modules
        assert lazy.defer("no_such_module_for_test") is False
        user = importlib.import_module("user_mod_for_test")  # `import heavy_pkg_for_test` at its top
        assert (tmp_path / "loads.txt").read_text() == "" and not lazy.loaded("heavy_pkg_for_test")
        assert user.use() == 42  # first use: the real import runs, once
        assert (tmp_path / "loads.txt").read_text() == "x" and lazy.loaded("heavy_pkg_for_test")
        assert user.use() == 42 and (tmp_path / "loads.txt").read_text() == "x"
        from heavy_pkg_for_test.sub import OTHER  # submodules import as usual afterwards

        assert OTHER == 7
    finally:
        for name in ("heavy_pkg_for_test", "heavy_pkg_for_test.sub", "user_mod_for_test"):
            sys.modules.pop(name, None)


def test_a_submodule_import_before_any_use_loads_the_real_package(tmp_path, monkeypatch):
    pkg = tmp_path / "heavy_pkg_two_for_test"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("VALUE = 1\n")
    (pkg / "sub.py").write_text("OTHER = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    lazy = _module()
    try:
        assert lazy.defer("heavy_pkg_two_for_test")
        import heavy_pkg_two_for_test.sub as sub

        assert sub.OTHER == 2 and sys.modules["heavy_pkg_two_for_test"].VALUE == 1
    finally:
        for name in ("heavy_pkg_two_for_test", "heavy_pkg_two_for_test.sub"):
            sys.modules.pop(name, None)
