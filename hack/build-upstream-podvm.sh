#!/bin/sh
# Builds the two programs of upstream peer-pods' pod VM image that caa's
# user data and relay talk to, for `make test-upstream-podvm`:
# process-user-data and agent-protocol-forwarder, into OUT/bin.
#
#   hack/build-upstream-podvm.sh ADAPTOR_GIT KATA_GIT OUT [ADAPTOR_REV [KATA_REV]]
#
# ADAPTOR_GIT: a clone (bare or not) of github.com/confidential-containers/cloud-api-adaptor
# KATA_GIT:    a clone of github.com/kata-containers/kata-containers
# The revisions default to the ones caa was last checked against; KATA_REV
# must be the kata runtime the adaptor's go.mod requires. kata's runtime
# module is taken from the clone (go.mod replace), so only the Go module
# proxy is needed for the rest.
set -eu
[ $# -ge 3 ] || { sed -n '2,13p' "$0"; exit 2; }
adaptor=$1 kata=$2 out=$3
adaptor_rev=${4:-fbdde756}
kata_rev=${5:-cf82bb35c803}
gitdir() { if [ -d "$1/.git" ]; then echo "$1/.git"; else echo "$1"; fi; }
src=$out/src
mkdir -p "$src/adaptor" "$src/kata" "$out/bin"
git --git-dir="$(gitdir "$adaptor")" archive "$adaptor_rev" src | tar -x -C "$src/adaptor"
git --git-dir="$(gitdir "$kata")" archive "$kata_rev" src/runtime src/libs | tar -x -C "$src/kata"
cd "$src/adaptor/src/cloud-api-adaptor"
go mod edit -replace "github.com/kata-containers/kata-containers/src/runtime=$src/kata/src/runtime"
go build -o "$out/bin/" ./cmd/process-user-data ./cmd/agent-protocol-forwarder
echo "built into $out/bin; run: CAA_UPSTREAM_PODVM_BIN=$out/bin make test-upstream-podvm"
