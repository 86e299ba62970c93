# syntax=docker/dockerfile:1
# caa's container image, one per cloud: `make image CLOUDS=aws VERSION=v1.2.3`
# builds the EC2-only image and tags it caa:v1.2.3-aws, the image
# deploy/overlays/aws deploys (likewise azure and ibmcloud). Without CLOUDS
# the image holds every cloud (tag caa:v1.2.3): larger, and resident memory
# well above what the overlays request (deploy/README.md, The image).
# By hand: docker build --build-arg CLOUDS=aws --build-arg VERSION=v1.2.3 -t caa:v1.2.3-aws .
# The binary is built by `make static`, the same target a developer runs, so
# the image cannot be built in a way the tests never saw (deploy/static_test.go
# runs that target from the files this build context admits).

# The builder runs on the build host's platform and cross-compiles: the
# binary is pure Go (CGO_ENABLED=0), so GOOS/GOARCH are all it takes.
FROM --platform=$BUILDPLATFORM golang:1.26 AS build
ARG TARGETOS
ARG TARGETARCH
ARG VERSION=dev
# The providers built in: aws, azure or ibmcloud (the per-cloud images the
# overlays deploy), or a comma-separated set; empty builds every cloud.
# `make static` refuses a name it does not know rather than silently
# building them all.
ARG CLOUDS=
WORKDIR /src
# Modules first, so a source change does not download them again.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CLOUDS="$CLOUDS" GOOS=$TARGETOS GOARCH=$TARGETARCH make static VERSION="$VERSION" STATIC_OUT=/out/caa

# No shell, no package manager, no libc: the static binary, CA
# certificates for the cloud APIs, and a non-root default user (65532).
# The DaemonSet in deploy/ overrides the user with UID 0 and no
# capabilities, for the hostPath ledger; deploy/README.md says why.
FROM gcr.io/distroless/static-debian12:nonroot
# Which build this is, readable with `docker inspect` without running it.
ARG VERSION=dev
ARG CLOUDS=
LABEL org.opencontainers.image.version="${VERSION}" \
      dev.caa.clouds="${CLOUDS:-aws,azure,ibmcloud}"
COPY --from=build /out/caa /usr/local/bin/caa
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/caa"]
CMD ["run"]
