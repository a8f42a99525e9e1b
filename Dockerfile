# syntax=docker/dockerfile:1
# The crdipc image: one binary, every service (`crdipc <command>`), for config/default.
#   make image-docker               # docker build -t crdipc/crdipc:$(cat VERSION) .
# `make image` builds the same contents without a Docker engine (hack/image.sh: Debian packages,
# umoci, skopeo) into bin/crdipc-image.tar: keep the two in step (packages, labels, user,
# entrypoint). See docs/deploy.md.

# Build: as `make build` and hack/image.sh build it (cgo on: the standard library's net and
# os/user link glibc). The builder is Debian bookworm like the base below, so the binary needs
# no newer glibc than the image has.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
# go.mod replaces a module with this directory (third_party/*/README.md).
COPY third_party/ third_party/
RUN --mount=type=cache,target=/go/pkg/mod \
    go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    go build -ldflags="-s -w" -o /out/crdipc ./cmd/crdipc

# Run: what the CSI node plugin executes on a node. mount (mount, umount, losetup),
# util-linux (blkid, fsck), e2fsprogs (mkfs.ext4/ext3, fsck.ext4), xfsprogs (mkfs.xfs: without
# it the node offers no xfs), fuse3 (fusermount3, used only when a direct FUSE mount is
# refused). The other services need none of it; one image keeps one version to deploy.
FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends mount util-linux e2fsprogs xfsprogs fuse3 \
    && rm -rf /var/lib/apt/lists/*
# The binary's version comes from the file VERSION (embedded by the root package); this is
# only the image's label. `make image-docker` passes the same file's contents.
ARG VERSION=dev
LABEL org.opencontainers.image.title="crdipc" \
      org.opencontainers.image.description="Kubernetes custom resources as the channel between services" \
      org.opencontainers.image.source="https://github.com/crdipc/crdipc" \
      org.opencontainers.image.version="${VERSION}"
COPY --from=build /out/crdipc /usr/local/bin/crdipc
# Non-root by default (the "nonroot" uid of distroless images). The manifests say which
# containers run as root: the pool agent (host directory /var/lib/crdipc, no capabilities)
# and the CSI node plugin (privileged: loop devices, FUSE, mounts).
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/crdipc"]
CMD ["--help"]
