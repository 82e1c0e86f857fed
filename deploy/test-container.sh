#!/usr/bin/env bash
# Build the image the container test runs (tests/test_container.py, marker `container`),
# with the distribution's tools only: no image registry is needed.
#
#   deploy/test-container.sh base     the base image localhost/gpreempt-base:bookworm, from
#                                     debootstrap (once per machine, a few minutes)
#   deploy/test-container.sh image    the gpreempt image on that base, tagged with a hash of
#                                     the sources: rebuilt only when they change (~1 min)
#   deploy/test-container.sh          both, each only if missing; prints the image's name
#
# Exit code 77: something needed is missing here (podman, runc, or debootstrap for a base
# that does not exist yet); the test is then skipped with the message on stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=localhost/gpreempt-base:bookworm
missing() { echo "$1" >&2; exit 77; }
command -v podman >/dev/null || missing "podman is not installed (apt-get install podman runc)"
command -v runc >/dev/null || missing "runc is not installed (apt-get install runc)"

build_base() {
    command -v debootstrap >/dev/null \
        || missing "no base image $BASE and no debootstrap to make one (apt-get install debootstrap)"
    dir=$(mktemp -d /var/tmp/gpreempt-base.XXXXXX)
    trap 'rm -rf "$dir"' EXIT
    debootstrap --variant=minbase --include=python3,python3-venv bookworm "$dir" >&2 \
        || missing "debootstrap failed (is a Debian mirror reachable?)"
    rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/*
    tar -C "$dir" -c . | podman import - "$BASE" >&2
}

image_name() {
    hash=$(cat pyproject.toml deploy/Containerfile $(git ls-files src 2>/dev/null || find src -type f) \
        | sha256sum | cut -c1-12)
    echo "localhost/gpreempt-test:$hash"
}

build_image() {
    image=$(image_name)
    if ! podman image exists "$image"; then
        BASE=$BASE ENGINE=podman BUILD_ARGS="--isolation chroot" deploy/build-image.sh "$image" >&2
    fi
    echo "$image"
}

case "${1:-all}" in
    base) build_base ;;
    image) build_image ;;
    all)
        podman image exists "$BASE" || build_base
        build_image
        ;;
    *) echo "usage: $0 [base|image]" >&2; exit 2 ;;
esac
