package bench

import (
	"crypto/sha256"
	"testing"
	"time"
)

// machineBusy counts this process's own work: a tenth of a second of hashing shows up in
// it, while the same time asleep adds (nearly) nothing.
func TestMachineBusy(t *testing.T) {
	before, err := machineBusy()
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(nil)
	for start := time.Now(); time.Since(start) < 200*time.Millisecond; {
		sum = sha256.Sum256(sum[:])
	}
	after, err := machineBusy()
	if err != nil {
		t.Fatal(err)
	}
	// /proc/stat counts in clock ticks (10 ms); 200 ms of one busy thread must show.
	if d := after - before; d < 0.1 {
		t.Errorf("200 ms of hashing: the machine was busy %.3f s, want ≥ 0.1 s", d)
	}
}
