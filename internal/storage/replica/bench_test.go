package replica

import (
	"math/rand/v2"
	"os"
	"sync/atomic"
	"testing"
	"time"
)

func benchWrites(b *testing.B, blockSize int, random bool) {
	const size = 256 << 20
	pki := newTestPKI(b)
	n := newTestNode(b, pki, "node-a")
	n.create("ns/r", size)
	n.start()
	ctx := ctxT(b)
	r := n.dial(b).Replica("ns/r")
	if _, err := r.Open(ctx); err != nil {
		b.Fatal(err)
	}
	var seq, rev atomic.Int64
	b.SetBytes(int64(blockSize))
	b.SetParallelism(8) // in flight per core, like a target pipelining writes
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		buf := make([]byte, blockSize)
		pattern(buf, 1)
		rng := rand.New(rand.NewPCG(uint64(seq.Add(1)), 1))
		blocks := int64(size / blockSize)
		for pb.Next() {
			var blk int64
			if random {
				blk = rng.Int64N(blocks)
			} else {
				blk = seq.Add(1) % blocks
			}
			if err := r.WriteAt(ctx, buf, blk*int64(blockSize), uint64(rev.Add(1))); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func BenchmarkWriteSequential1MiB(b *testing.B) { benchWrites(b, 1<<20, false) }
func BenchmarkWriteRandom4KiB(b *testing.B)     { benchWrites(b, 4<<10, true) }

// BenchmarkRead1MiB reads a replica (in the page cache) 1 MiB at a time, 16 in flight, over
// each link a target uses (TLS; the local socket, for the replica on the target's node),
// and reports it against a floor of the same run: the same reads of the same file with
// pread, what a reader of the replica's file itself would do (floor-MB/s, and link/floor,
// the share of it the link keeps).
func BenchmarkRead1MiB(b *testing.B) {
	for _, link := range []string{"tls", "local"} {
		b.Run("link="+link, func(b *testing.B) { benchRead1MiB(b, link == "local") })
	}
}

func benchRead1MiB(b *testing.B, local bool) {
	const size = 64 << 20
	pki := newTestPKI(b)
	n := newTestNode(b, pki, "node-a")
	n.local = local
	n.create("ns/r", size)
	fillFile(b, n.path("ns/r"), 1, Extent{0, size})
	n.start()
	ctx := ctxT(b)
	conn := n.dial
	if local {
		conn = n.dialLocal
	}
	r := conn(b).Replica("ns/r")
	f, err := os.Open(n.path("ns/r"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	read := func(b *testing.B, readAt func([]byte, int64) error) time.Duration {
		var seq atomic.Int64
		b.SetParallelism(8)
		start := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			buf := make([]byte, 1<<20)
			for pb.Next() {
				if err := readAt(buf, (seq.Add(1)%64)<<20); err != nil {
					b.Error(err)
					return
				}
			}
		})
		return time.Since(start)
	}
	floor := read(b, func(p []byte, off int64) error {
		_, err := f.ReadAt(p, off)
		return err
	})
	floorMBs := float64(b.N) * (1 << 20) / 1e6 / floor.Seconds()
	b.SetBytes(1 << 20)
	b.ResetTimer()
	link := read(b, func(p []byte, off int64) error { return r.ReadAt(ctx, p, off) })
	b.StopTimer()
	linkMBs := float64(b.N) * (1 << 20) / 1e6 / link.Seconds()
	b.ReportMetric(floorMBs, "floor-MB/s")
	b.ReportMetric(linkMBs/floorMBs, "link/floor")
}
