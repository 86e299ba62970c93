# syntax=docker/dockerfile:1
# caa's container image: `make image` (or docker build --build-arg VERSION=v1.2.3 .).
# The binary is built by `make static`, the same target a developer runs, so
# the image cannot be built in a way the tests never saw (deploy/static_test.go
# runs that target from the files this build context admits).

# The builder runs on the build host's platform and cross-compiles: the
# binary is pure Go (CGO_ENABLED=0), so GOOS/GOARCH are all it takes.
FROM --platform=$BUILDPLATFORM golang:1.26 AS build
ARG TARGETOS
ARG TARGETARCH
ARG VERSION=dev
# Empty: every cloud. CLOUDS=aws (or azure, ibmcloud) builds one provider
# only: a smaller image and a smaller resident set on every node.
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
COPY --from=build /out/caa /usr/local/bin/caa
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/caa"]
CMD ["run"]
