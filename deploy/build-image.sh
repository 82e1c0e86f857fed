#!/usr/bin/env bash
# Build the daemon's image from this checkout: wheels first (from the package indexes pip is
# configured with), then the image with podman (or docker) from deploy/Containerfile.
#
#   deploy/build-image.sh [IMAGE]      IMAGE defaults to gpreempt:<version>
#   BASE=...  base image with python3 (default: python:3.11-slim-bookworm)
#   ENGINE=podman|docker, BUILD_ARGS="--isolation chroot" (extra build options)
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml","rb"))["project"]["version"])' 2>/dev/null \
    || sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
image=${1:-gpreempt:$version}
engine=${ENGINE:-$(command -v podman >/dev/null && echo podman || echo docker)}
rm -rf dist/wheels
python3 -m pip wheel --quiet --wheel-dir dist/wheels . nvidia-ml-py
base_arg=()
[ -n "${BASE:-}" ] && base_arg=(--build-arg "BASE=$BASE")
# shellcheck disable=SC2086  # BUILD_ARGS is a list of options
"$engine" build ${BUILD_ARGS:-} "${base_arg[@]}" -f deploy/Containerfile -t "$image" .
echo "built $image"
