package realnode

// Kubelet is a real kubelet of the node.
type Kubelet struct {
	proc *proc
}

func (k *Kubelet) stop() {}
