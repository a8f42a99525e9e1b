package target

import (
	"math/rand/v2"
	"sync/atomic"
	"testing"
)

// BenchmarkEngineRandomWrite4KiB is the engine alone, with no FUSE, loop device or file
// system above it: 4 KiB writes at random sectors, 16 in flight, to three replica servers
// over TLS on loopback. Beside crdipc bench volume's ceiling (the layers above the engine
// with a Device that costs nothing) it divides a volume's random-write cost between the
// two (docs/performance.md).
func BenchmarkEngineRandomWrite4KiB(b *testing.B) {
	c := newCluster(b)
	c.startEngine()
	var seed atomic.Uint64
	b.SetBytes(4096)
	b.SetParallelism(8) // 16 in flight on 2 cores, as fio's iodepth
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		rng := rand.New(rand.NewPCG(seed.Add(1), 1))
		buf := make([]byte, 4096)
		for pb.Next() {
			if _, err := c.e.WriteAt(buf, rng.Int64N(itSize/4096)*4096); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
