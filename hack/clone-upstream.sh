#!/bin/sh
# Prints a directory for UPSTREAM_SRC, cloning upstream's two repositories
# into it first when they are not there yet: make test's real-node and
# upstream pod VM suites build kata's shim and the pod VM's programs from
# them (test/e2e/upstream checks that the pinned commits are present).
# CI passes a directory of pinned archives instead and never runs this.
#
#   hack/clone-upstream.sh [DIR]     (default ~/.cache/caa-e2e/upstream-src)
set -eu
dir=${1:-${HOME}/.cache/caa-e2e/upstream-src}
mkdir -p "$dir"
for repo in confidential-containers/cloud-api-adaptor kata-containers/kata-containers; do
	name=${repo#*/}
	[ -d "$dir/$name" ] && continue
	# Into a temporary name, then renamed: two suites may ask at once.
	tmp=$(mktemp -d "$dir/.$name.XXXXXX")
	echo "cloning https://github.com/$repo for UPSTREAM_SRC into $dir/$name" >&2
	if ! git clone --quiet --no-checkout "https://github.com/$repo" "$tmp/$name" >&2; then
		rm -rf "$tmp"
		echo "could not clone https://github.com/$repo: set UPSTREAM_SRC to a directory of the pinned archives or clones (README, Tests)" >&2
		exit 2
	fi
	mv "$tmp/$name" "$dir/$name" 2>/dev/null || true
	rm -rf "$tmp"
done
echo "$dir"
