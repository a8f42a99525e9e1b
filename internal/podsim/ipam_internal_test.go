package podsim

import (
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

// The allocator alone: which IP a pod gets when the one it asks for is held here, reported by a
// pod this runtime does not run, or released.
func TestIPAllocator(t *testing.T) {
	reported := map[string]types.UID{} // IP → a pod elsewhere that reports it
	a := newIPAllocator(func(ip string, uid types.UID) bool {
		owner, ok := reported[ip]
		return ok && owner != uid
	})
	a.next = 0 // it starts at a random IP; from the first here, the order is predictable
	assign := func(uid types.UID, want, expect string) {
		t.Helper()
		got, err := a.assign(uid, want)
		if err != nil || got != expect {
			t.Fatalf("assign(%s, %q) = %q, %v; want %q", uid, want, got, err, expect)
		}
	}

	assign("a", "", podIPAt(0))
	assign("b", "127.2.0.9", "127.2.0.9") // a pod keeps the IP its status reports
	assign("c", "127.2.0.9", podIPAt(1))  // … unless another pod here holds it
	assign("b", "127.2.0.9", "127.2.0.9") // its own IP is free for it
	assign("d", "10.0.0.1", podIPAt(2))   // not a pod IP: the next free one
	reported[podIPAt(3)] = "elsewhere"    // a live pod this runtime has not seen yet
	assign("e", "", podIPAt(4))           // … is skipped
	assign("elsewhere", podIPAt(3), podIPAt(3))

	a.release("127.2.0.9", "c") // not c's: nothing happens
	assign("f", "127.2.0.9", podIPAt(5))
	a.release("127.2.0.9", "b")
	assign("g", "127.2.0.9", "127.2.0.9")
}

func TestIPAllocatorExhausted(t *testing.T) {
	a := newIPAllocator(func(string, types.UID) bool { return true })
	if ip, err := a.assign("a", ""); err == nil {
		t.Fatalf("assign with every IP reported elsewhere = %q, want an error", ip)
	}
}
