package reconcile

import (
	"fmt"
	goruntime "runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// TestEventsKeepBoundedMemory: caa's events name a VM or sandbox id, so
// nearly each is a new key in the recorder's caches. With client-go's
// default of 4,096 entries per cache, every StartVM/StopVM cycle left its
// events there (S11: caa's heap grew about 4.5 KiB a cycle over 1,000
// cycles). Once the caches are full, thousands more distinct events must
// leave nothing more behind: the heap objects still live after a
// collection grow by fewer than one per two events sent (with the default,
// about 21 per event, up to 4,096 events).
func TestEventsKeepBoundedMemory(t *testing.T) {
	const n = 4000 // twice what fills EventCacheSize entries many times over
	client := fake.NewClientset()
	var sent atomic.Int64
	client.PrependReactor("create", "events", func(a k8stesting.Action) (bool, runtime.Object, error) {
		sent.Add(1) // answered here: the fake's tracker would keep every event
		return true, a.(k8stesting.CreateAction).GetObject(), nil
	})
	ev := NewKubeEvents(client, "worker-1")
	defer ev.Shutdown()
	var before uint64
	for i := range n {
		if i == n/2 {
			before = liveObjects() // the caches hold what they are to hold by now
		}
		pod := &Pod{UID: fmt.Sprintf("uid-%d", i), Namespace: "team", Name: fmt.Sprintf("web-%d", i)}
		ev.Event(pod, false, EventVMCreated, fmt.Sprintf("VM i-%017x of sandbox %012x runs at 10.0.%d.%d", i, i, i/256, i%256))
		if (i+1)%100 == 0 { // the broadcaster drops events past 1,000 queued
			require.Eventually(t, func() bool { return sent.Load() == int64(i+1) }, 30*time.Second, time.Millisecond)
			client.ClearActions() // the fake keeps every call made
		}
	}
	require.Eventually(t, func() bool { return sent.Load() == n }, 60*time.Second, 10*time.Millisecond, "every event reaches the API")
	after := liveObjects()
	grown := int64(after) - int64(before)
	assert.Less(t, grown, int64(n/4),
		"heap objects still live after %d more distinct events: %d more (the recorder's caches must stay at %d entries)", n/2, grown, EventCacheSize)
}

func liveObjects() uint64 {
	var m goruntime.MemStats
	goruntime.GC()
	goruntime.GC()
	goruntime.ReadMemStats(&m)
	return m.HeapObjects
}
