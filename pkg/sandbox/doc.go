// Package sandbox runs the life of kata sandboxes when caa is kata's remote
// hypervisor: CreateVM records a sandbox, StartVM gives it a VM, a tunnel
// and an agent relay, StopVM takes them away; after a restart, Adopt serves
// every recorded sandbox again without a cloud write.
//
// The unit is the sandbox, not the pod: a pod has one sandbox or more over
// its life (the kubelet starts a new one when one fails), each with its own
// VM, recorded in the ledger by sandbox id (ledger.Sandbox). The rules:
//
//   - Intent first (invariant I2): the record is Creating, with the
//     idempotency key, before the cloud create; a create repeated after a
//     crash uses the same key, so the cloud returns the VM the first made.
//   - A VM found gone under a live sandbox is never recreated for it (its
//     containers' state was in that VM): the sandbox turns Lost, its agent
//     socket closes, an event goes on the pod, and kata fails the sandbox.
//   - A VM is deleted only on positive evidence (invariant I3): StopVM for
//     its sandbox, the sandbox's pod absent from the full synced pod cache
//     or terminal, or a newer sandbox of the same pod that runs (it
//     supersedes the older one). A shutdown deletes nothing (I4).
//   - Orphans (orphans.go): a VM tagged for this node that no sandbox
//     record and no pod record names is deleted once seen as an orphan in
//     listings the grace apart, as in the informer mode; a live sandbox's
//     VM never is. The pod records of a node switched over from the
//     informer mode keep their VMs (no recreate, no delete) until their
//     pods go.
//
// The pod VM side (certificates, user data, tunnel, relay) is behind the
// PodSide interface so that the lifecycle is tested without namespaces.
package sandbox
