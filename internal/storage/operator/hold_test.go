package operator

import (
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// A new volume's first status is held back for twice what volumes recently took to
// settle: a second while agents answer at once, longer while they work through a
// backlog (never beyond maxSettleTime), and a second again once they keep up.
func TestHoldFollowsAgents(t *testing.T) {
	h := &volumeHandler{}
	placedAgo := func(uid types.UID, ago time.Duration) {
		h.placed(uid)
		h.mu.Lock()
		h.placedAt[uid] = time.Now().Add(-ago)
		h.mu.Unlock()
	}
	// settleAll places n volumes that settle after took.
	settleAll := func(name string, n int, took time.Duration) {
		for i := range n {
			uid := types.UID(fmt.Sprintf("%s-%d", name, i))
			placedAgo(uid, took)
			h.settled(uid)
		}
	}
	// window is the whole hold a volume placed now gets: what holdFor leaves of it for
	// one placed a moment ago.
	window := func() time.Duration {
		placedAgo("probe", 0)
		left := h.holdFor("probe")
		h.mu.Lock()
		delete(h.placedAt, "probe") // not settled: the probe must not move the average
		h.mu.Unlock()
		return left.Round(100 * time.Millisecond)
	}
	if w := window(); w != settleTime {
		t.Fatalf("hold with no volume settled yet: %v, want %v", w, settleTime)
	}
	settleAll("quick", 10, 20*time.Millisecond)
	if w := window(); w != settleTime {
		t.Fatalf("hold while agents answer in 20ms: %v, want %v", w, settleTime)
	}

	// A backlog: volumes settle 0.9 s after placement, within the hold.
	for i := range 10 {
		uid := types.UID(fmt.Sprintf("backlog-%d", i))
		placedAgo(uid, 900*time.Millisecond)
		if h.holdFor(uid) <= 0 {
			t.Fatalf("volume %d placed 0.9 s ago is no longer held", i)
		}
		h.settled(uid)
	}
	if w := window(); w < 1700*time.Millisecond || w > 1800*time.Millisecond {
		t.Fatalf("hold after volumes took 0.9 s: %v, want about 1.8 s", w)
	}
	placedAgo("late", 1200*time.Millisecond)
	if left := h.holdFor("late"); left <= 0 {
		t.Fatal("a volume placed 1.2 s ago is no longer held: the hold did not follow the agents")
	}

	// Agents far behind: the hold stops at maxSettleTime.
	settleAll("behind", 20, 4*time.Second)
	if w := window(); w != maxSettleTime {
		t.Fatalf("hold after volumes took 4 s: %v, want the most, %v", w, maxSettleTime)
	}
	placedAgo("expired", maxSettleTime+time.Millisecond)
	if left := h.holdFor("expired"); left != 0 {
		t.Fatalf("a volume placed beyond the longest hold is still held (%v): agents that never answer must show", left)
	}

	// Caught up again.
	settleAll("caught-up", 20, 20*time.Millisecond)
	if w := window(); w != settleTime {
		t.Fatalf("hold once agents answer in 20ms again: %v, want %v", w, settleTime)
	}
}
