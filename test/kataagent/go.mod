// A test-only module: the kata agent stand-in for the fake pod VM. It is
// built by test/e2e/upstream, which replaces kata's runtime module by the
// kata 4.1.0 tree from $UPSTREAM_SRC (-modfile); nothing here enters caa's
// go.mod.
module github.com/caa-project/caa/test/kataagent

go 1.26.0

require (
	github.com/containerd/ttrpc v1.2.10
	github.com/kata-containers/kata-containers/src/runtime v0.0.0-00010101000000-000000000000
	google.golang.org/grpc v1.82.1
	google.golang.org/protobuf v1.36.12
)

require (
	github.com/containerd/log v0.1.0 // indirect
	github.com/opencontainers/runtime-spec v1.2.1 // indirect
	github.com/sirupsen/logrus v1.9.4 // indirect
	golang.org/x/sys v0.46.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260414002931-afd174a4e478 // indirect
)
