#!/usr/bin/env bash
# A folder of wheels from which a compute node without internet installs the project beside its
# own CUDA torch and Triton. Run it on a machine with a package index:
#
#   bash scripts/wheelhouse.sh OUT_DIR [--python-version X.Y] [--have FILE]
#
# then on the node (Python X.Y, manylinux x86_64, torch preinstalled), a venv that sees its packages:
#
#   bash scripts/offline_install.sh OUT_DIR ENV    # python3 -m venv, pip install --no-index --find-links OUT_DIR
#
# OUT_DIR (new or empty) gets the project's own wheel and one wheel of each package it needs,
# resolved for CPython X.Y (default 3.12) on manylinux_2_28 x86_64 (torch's own wheels need
# glibc 2.28), never torch, triton, nvidia-* or cuda-* (the node's CUDA torch brings those).
# --have FILE: a `pip freeze` of the node; its packages are left out, and the resolution keeps
# their versions, so what is added fits what is there (a line with a bare name: held, version
# unknown). Sdist-only packages are built into wheels here, if pure Python. Needs pip and uv
# (installed into a temporary venv when absent).
# Environment: PYTHON (default python3) runs pip; uv and pip read their usual configuration.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3}
usage="usage: scripts/wheelhouse.sh OUT_DIR [--python-version X.Y] [--have FILE]"
fail() { echo "wheelhouse.sh: $*" >&2; exit 2; }

out="" version=3.12 have=""
while [ $# -gt 0 ]; do
    case $1 in
        --python-version) [ $# -ge 2 ] || fail "--python-version needs a value like 3.12"; version=$2; shift 2 ;;
        --have) [ $# -ge 2 ] || fail "--have needs a file (the node's pip freeze); $usage"; have=$2; shift 2 ;;
        -h|--help) echo "$usage"; exit 0 ;;
        -*) fail "unknown option $1; $usage" ;;
        *) [ -z "$out" ] || fail "one OUT_DIR only, got $out and $1; $usage"; out=$1; shift ;;
    esac
done
[ -n "$out" ] || fail "OUT_DIR is missing; $usage"
[[ $version =~ ^3\.[0-9]+$ ]] || fail "--python-version must look like 3.12, got '$version'"
[ -z "$have" ] || [ -f "$have" ] || fail "--have: no file $have (on the node: python3 -m pip freeze > FILE)"
if [ -e "$out" ] && { [ ! -d "$out" ] || [ -n "$(ls -A "$out")" ]; }; then
    fail "OUT_DIR $out exists and is not an empty folder: give a new one (nothing in it is replaced)"
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if command -v uv >/dev/null; then UV=(uv)
elif "$PYTHON" -m uv --version >/dev/null 2>&1; then UV=("$PYTHON" -m uv)
else
    "$PYTHON" -m venv "$tmp/uv-venv" && "$tmp/uv-venv/bin/pip" install -q uv || fail "uv is needed: pip install uv"
    UV=("$tmp/uv-venv/bin/uv")
fi

# The node's packages as name==version constraints (local labels such as +cu130 dropped: the
# index has the plain release), and their names, normalised.
: >"$tmp/constraints.txt"
: >"$tmp/held.txt"
if [ -n "$have" ]; then
    sed -nE 's/^([A-Za-z0-9][A-Za-z0-9._-]*)==([^ ;+#]+).*/\1==\2/p' "$have" >"$tmp/constraints.txt"
    sed -nE 's/^([A-Za-z0-9][A-Za-z0-9._-]*) *(==.*| @ .*)?$/\1/p' "$have" | tr 'A-Z_.' 'a-z--' >"$tmp/held.txt"
fi

# The project's wheel, built from a copy (setuptools writes build/ and *.egg-info into its source).
mkdir -p "$tmp/src"
cp "$REPO/pyproject.toml" "$REPO/README.md" "$tmp/src/"
tar -C "$REPO" --exclude=__pycache__ -cf - dispersion_titan | tar -C "$tmp/src" -xf -
"${UV[@]}" build -q --wheel --out-dir "$out" "$tmp/src"

links=()  # pip's find-links, which uv does not read by itself (as in scripts/setup_env.sh)
for link in ${PIP_FIND_LINKS:-$("$PYTHON" -m pip config get global.find-links 2>/dev/null || true)}; do
    links+=(--find-links "$link")
done
"${UV[@]}" pip compile -q "${links[@]}" --no-header --no-annotate --python-version "$version" \
    --python-platform x86_64-manylinux_2_28 -c "$tmp/constraints.txt" -o "$tmp/resolved.txt" "$tmp/src/pyproject.toml"
# Leave out what the node holds or its CUDA torch brings.
while read -r line; do
    name=$(echo "${line%%==*}" | tr 'A-Z_.' 'a-z--')
    case $name in torch|triton|pytorch-triton|nvidia-*|cuda-*) continue ;; esac
    grep -qxF "$name" "$tmp/held.txt" || echo "$line"
done < <(grep -E '^[A-Za-z0-9]' "$tmp/resolved.txt") >"$tmp/needed.txt"

platforms=()
for minor in 28 27 26 25 24 17; do platforms+=(--platform "manylinux_2_${minor}_x86_64"); done
platforms+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
mkdir -p "$tmp/dl"
if [ -s "$tmp/needed.txt" ]; then
    # --no-deps: the list is already complete; a package with no wheel for the node comes as its sdist
    "$PYTHON" -m pip download -q --no-deps --disable-pip-version-check --python-version "$version" \
        --implementation cp --abi "cp${version/./}" "${platforms[@]}" -d "$tmp/dl" -r "$tmp/needed.txt"
fi
for file in "$tmp"/dl/*; do
    [ -e "$file" ] || continue
    case $file in
        *.whl) mv "$file" "$out/" ;;
        *)  # an sdist: built here, kept only if pure Python
            "${UV[@]}" build -q --wheel --out-dir "$tmp/built" "$file"
            for wheel in "$tmp"/built/*.whl; do
                case $wheel in *-none-any.whl) mv "$wheel" "$out/" ;;
                    *) fail "$(basename "$file") has no wheel for CPython $version manylinux and is not pure Python" ;;
                esac
            done ;;
    esac
done

dupes=$(ls "$out" | sed -E 's/-[0-9][^-]*-.*//' | tr 'A-Z_.' 'a-z--' | sort | uniq -d)
[ -z "$dupes" ] || fail "more than one version of: $dupes"
echo "wheelhouse: $(ls "$out" | wc -l) wheels, $(du -sb "$out" | awk '{printf "%.1f", $1 / 1048576}') MiB in $out" \
    "(CPython $version, manylinux x86_64${have:+; left out what $have holds})"
echo "on the node: bash scripts/offline_install.sh $out ENV (a venv over python3; pip install --no-index)"
