#!/usr/bin/env bash
# Build the Debian base image that Harbor tasks start FROM, without an image registry.
#
#   scripts/base_image.sh       (as root; `make base-image` runs it; ~3 min and ~200 MB the first time)
#
# debootstrap fetches Debian bookworm's minbase from Debian's package mirror (DEBIAN_MIRROR), and
# `docker import` turns the folder into debian:bookworm, also tagged debian:bookworm-slim, so task
# Dockerfiles that say `FROM debian:bookworm-slim` build unchanged. Idempotent: an existing image is
# kept (FORCE=1 rebuilds). Machines that can reach Docker Hub can `docker pull debian:bookworm-slim`.
set -euo pipefail

MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
TAGS=(debian:bookworm debian:bookworm-slim)

if ! docker info >/dev/null 2>&1; then
  echo "base_image: no Docker daemon answers: run scripts/docker_up.sh (make docker) first" >&2
  exit 1
fi

have_all=1
for tag in "${TAGS[@]}"; do
  docker image inspect "$tag" >/dev/null 2>&1 || have_all=0
done
if [ "$have_all" = 1 ] && [ -z "${FORCE:-}" ]; then
  echo "base image: ${TAGS[*]} already present"
  exit 0
fi

if ! command -v debootstrap >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi

ROOTFS=$(mktemp -d /var/tmp/rlcli-rootfs.XXXXXX)
trap 'rm -rf "$ROOTFS"' EXIT
echo "base image: debootstrap bookworm (minbase) from $MIRROR"
debootstrap --variant=minbase bookworm "$ROOTFS" "$MIRROR" >"$ROOTFS.log" 2>&1 || {
  tail -n 20 "$ROOTFS.log" >&2; rm -f "$ROOTFS.log"; exit 1; }
rm -f "$ROOTFS.log"
# Package lists and caches are ~100 MB that every task image would carry; `apt-get update` refetches them.
rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/*.bin "$ROOTFS"/var/cache/apt/archives/*.deb

# docker import keeps no config: give the image the PATH and CMD a pulled debian image has.
tar -C "$ROOTFS" -c . | docker import \
  -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  -c 'CMD ["bash"]' - "${TAGS[0]}" >/dev/null
for tag in "${TAGS[@]:1}"; do
  docker tag "${TAGS[0]}" "$tag"
done
echo "base image: built ${TAGS[*]} ($(docker image inspect -f '{{.Size}}' "${TAGS[0]}" | numfmt --to=iec))"
