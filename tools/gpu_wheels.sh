#!/bin/sh
# Fill a folder with the wheels `tools/gpu_check.py --wheels` installs from on a machine with no
# network: pip itself, this project, and its runtime dependencies for CPython 3.10 to 3.13 on
# manylinux x86-64 (the device's Python version is not known in advance). Needs the registry.
# The kubernetes client and its tree (pydantic-core: 18 MiB over four Pythons) are left out:
# the check runs with --no-kube.enabled, and the package imports kubernetes only for that source.
set -eu
PYTHON=${PYTHON:-python3}
DEST=${1:-.cache/gpu-wheels}
PYTHONS=${GPU_WHEEL_PYTHONS:-3.10 3.11 3.12 3.13}
rm -rf "$DEST"
mkdir -p "$DEST"
$PYTHON -m pip wheel -q --no-deps -w "$DEST" .
$PYTHON -m pip download -q --only-binary=:all: -d "$DEST" pip
wheel=$(ls "$DEST"/dcgm_enricher-*.whl)
deps=$($PYTHON tools/gpu_check.py --print-requirements "$wheel")
for v in $PYTHONS; do
    abi=cp$(echo "$v" | tr -d .)
    # shellcheck disable=SC2086 # one requirement a word
    $PYTHON -m pip download -q --only-binary=:all: -d "$DEST" \
        --implementation cp --python-version "$v" --abi "$abi" --abi abi3 --abi none \
        --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux_2_28_x86_64 --platform any \
        $deps
done
echo "$DEST: $(ls "$DEST" | wc -l) wheels, $(du -sh "$DEST" | cut -f1)"
