#!/usr/bin/env bash
# Installs the project from a wheelhouse (scripts/wheelhouse.sh) with no package index, into a new
# venv ENV that sees the packages of this node's python3 (its CUDA torch and Triton):
#
#   bash scripts/offline_install.sh WHEELHOUSE ENV
#
# What `python3 -m venv --system-site-packages ENV` does for a system Python, also when python3 is
# itself a venv (as on the lent GPU nodes, /opt/torch/.venv), whose packages --system-site-packages
# would not show: ENV's node.pth adds the site folders python3 sees (their .pth files included).
# ENV's own packages come first. PYTHON (default python3) names the node's interpreter.
set -euo pipefail
PYTHON=${PYTHON:-python3}
fail() { echo "offline_install.sh: $*" >&2; exit 2; }
[ $# -eq 2 ] || fail "usage: scripts/offline_install.sh WHEELHOUSE ENV"
wheelhouse=$1 env=$2
ls "$wheelhouse"/dispersion_titan-*.whl >/dev/null 2>&1 ||
    fail "$wheelhouse holds no dispersion_titan wheel: build it with scripts/wheelhouse.sh"
[ ! -e "$env" ] || fail "$env exists: give a new folder for the venv"

# No pip of its own: an older setuptools that ensurepip adds (Python <= 3.11) would shadow the node's.
"$PYTHON" -m venv --without-pip "$env"
site=$("$env/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$PYTHON" - >"$site/node.pth" <<'EOF'
import site
print("import site; " + "; ".join(f"site.addsitedir({d!r})" for d in site.getsitepackages()))
EOF
"$env/bin/python" -m pip --version >/dev/null 2>&1 || "$env/bin/python" -m ensurepip -q  # the node's pip, else one
"$env/bin/python" -m pip install -q --no-index --disable-pip-version-check --find-links "$wheelhouse" dispersion-titan
check='import torch, dispersion_titan; print("beside torch", torch.__version__)'
echo "installed into $env: $("$env/bin/python" -c "$check")"
