package metricsagent

import (
	"errors"
	"fmt"
	"maps"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Pure unit tests of the checkpoint's encoding and of resuming: no API server involved.

func TestSeenRoundTrip(t *testing.T) {
	seen := map[types.UID]int32{
		"0b6c3c3e-7a4e-4f57-9a57-3d7e2c1f0a11": 1,
		"ffffffff-ffff-ffff-ffff-ffffffffffff": 1 << 30,
		"0B6C3C3E-7A4E-4F57-9A57-3D7E2C1F0A11": 3, // not canonical: kept as written
		"not-a-uuid":                           7,
	}
	b, horizon := encodeSeen(seen, nil, maxSeenBytes)
	if !horizon.IsZero() {
		t.Fatalf("horizon %v for a set that fits", horizon)
	}
	got, err := decodeSeen(b)
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(got, seen) {
		t.Fatalf("decoded %v, want %v", got, seen)
	}
	if n := len(appendSeen(nil, "0b6c3c3e-7a4e-4f57-9a57-3d7e2c1f0a11", 1)); n != 17 {
		t.Errorf("a UUID with count 1 takes %d bytes, want 17", n)
	}
}

// A set over the budget keeps the newest Events and drops the oldest, a whole group of equal
// first-seen times at a time; the horizon is the newest dropped time.
func TestSeenOverBudget(t *testing.T) {
	seen, first := map[types.UID]int32{}, map[types.UID]int64{}
	base := time.Date(2026, 3, 2, 10, 0, 0, 0, time.UTC)
	for i := range 100 {
		uid := types.UID(fmt.Sprintf("00000000-0000-4000-8000-%012d", i))
		seen[uid] = 1
		first[uid] = base.Add(time.Duration(i/2) * time.Second).UnixNano() // pairs share a second
	}
	// Room for 11 records: the 11th shares its time with the 12th, so both go.
	b, horizon := encodeSeen(seen, first, 11*17+5)
	got, err := decodeSeen(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 10 {
		t.Fatalf("kept %d Events, want the 10 newest", len(got))
	}
	if want := base.Add(44 * time.Second); !horizon.Equal(want) {
		t.Fatalf("horizon %v, want %v", horizon, want)
	}
	for uid := range got {
		if !time.Unix(0, first[uid]).After(horizon) {
			t.Errorf("kept %s, first seen %v, not after the horizon", uid, time.Unix(0, first[uid]))
		}
	}
}

func TestDecodeRejectsWhatItDidNotWrite(t *testing.T) {
	valid := func() *corev1.ConfigMap {
		return &corev1.ConfigMap{
			Data:       map[string]string{keyFormat: checkpointFormat, keyTotals: `[{"kind":"Branch","reason":"BranchPushed","type":"Normal","count":3}]`},
			BinaryData: map[string][]byte{keySeen: appendSeen(nil, "0b6c3c3e-7a4e-4f57-9a57-3d7e2c1f0a11", 3)},
		}
	}
	s, err := decodeCheckpoint(valid())
	if err != nil || s == nil || s.totals[labelSet{"Branch", "BranchPushed", "Normal"}] != 3 || len(s.seen) != 1 {
		t.Fatalf("valid checkpoint: %+v, %v", s, err)
	}
	for name, mutate := range map[string]func(*corev1.ConfigMap){
		"no format":       func(cm *corev1.ConfigMap) { delete(cm.Data, keyFormat) },
		"other format":    func(cm *corev1.ConfigMap) { cm.Data[keyFormat] = "2" },
		"totals not JSON": func(cm *corev1.ConfigMap) { cm.Data[keyTotals] = "{" },
		"empty label": func(cm *corev1.ConfigMap) {
			cm.Data[keyTotals] = `[{"kind":"","reason":"x","type":"Normal","count":1}]`
		},
		"series twice": func(cm *corev1.ConfigMap) {
			cm.Data[keyTotals] = `[{"kind":"Branch","reason":"x","type":"Normal","count":1},{"kind":"Branch","reason":"x","type":"Normal","count":2}]`
		},
		"seen truncated": func(cm *corev1.ConfigMap) { cm.BinaryData[keySeen] = cm.BinaryData[keySeen][:10] },
		"seen count 0":   func(cm *corev1.ConfigMap) { cm.BinaryData[keySeen][0] = 0 },
		"horizon":        func(cm *corev1.ConfigMap) { cm.Data[keyHorizon] = "yesterday" },
	} {
		cm := valid()
		mutate(cm)
		if _, err := decodeCheckpoint(cm); !errors.Is(err, errCorrupt) {
			t.Errorf("%s: err = %v, want errCorrupt", name, err)
		}
	}
	cm := valid()
	delete(cm.Data, keyTotals)
	if s, err := decodeCheckpoint(cm); s != nil || err != nil {
		t.Errorf("a claim without state: %+v, %v; want nil, nil", s, err)
	}
}

// Resuming: known Events add their growth, unknown ones in the first list are new unless
// first seen at or before the horizon, and checkpointed Events the list does not show are
// forgotten once it is handled.
func TestResume(t *testing.T) {
	horizon := time.Date(2026, 3, 2, 10, 0, 0, 0, time.UTC)
	ev := func(uid string, count int32, first time.Time) *corev1.Event {
		return &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{UID: types.UID(uid)},
			InvolvedObject: corev1.ObjectReference{APIVersion: "scm.crdipc.io/v1alpha1", Kind: "Branch"},
			Reason:         "BranchPushed", Type: corev1.EventTypeNormal, Count: count,
			FirstTimestamp: metav1.NewTime(first), LastTimestamp: metav1.NewTime(first),
		}
	}
	l := labelSet{"Branch", "BranchPushed", "Normal"}
	c := newEventCounter()
	c.resume(state{totals: map[labelSet]uint64{l: 10}, seen: map[types.UID]int32{"known": 2, "gone": 1}, horizon: horizon})
	c.OnAdd(ev("known", 5, horizon.Add(-time.Hour)), true)    // +3
	c.OnAdd(ev("dropped", 4, horizon), true)                  // accounted for
	c.OnAdd(ev("new", 2, horizon.Add(time.Second)), true)     // +2
	c.OnAdd(ev("later", 1, horizon.Add(-2*time.Hour)), false) // from the watch: +1
	c.OnUpdate(nil, ev("dropped", 6, horizon))                // +2
	c.OnUpdate(nil, ev("known", 5, horizon.Add(-time.Hour)))  // resync: +0
	c.OnAdd(ev("known", 5, horizon.Add(-time.Hour)), false)   // re-list: +0
	if got := c.totals[l]; got != 18 {
		t.Errorf("total %d, want 10 + 3 + 2 + 1 + 2", got)
	}
	c.markSynced()
	s, _, _ := c.snapshot()
	want := map[types.UID]int32{"known": 5, "dropped": 6, "new": 2, "later": 1}
	if !maps.Equal(s.seen, want) {
		t.Errorf("seen %v, want %v (the gone Event forgotten)", s.seen, want)
	}
}
