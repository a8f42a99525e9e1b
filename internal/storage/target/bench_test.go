package target

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// BenchmarkEngineRandomWrite4KiB is the engine alone, with no FUSE, loop device or file
// system above it: 4 KiB writes at random sectors to three replica servers over TLS on
// loopback, at 1, 4 and 16 writes in flight (fio's iodepth in crdipc bench volume is 16, but
// what reaches the engine through FUSE and the loop device is often fewer). Beside crdipc
// bench volume's ceiling (the layers above the engine with a Device that costs nothing) it
// divides a volume's random-write cost between the two (docs/performance.md).
//
// Wall time on two shared cores says little, so it reports CPU: cpu-µs/write is what this
// process (the engine, the three servers, and the kernel's work for their sockets and
// files) spent per write; floor-µs/write is the same for the floor measured in the same
// run, the three 4 KiB pwrites a write needs and nothing else; cpu/floor is their ratio.
// reads/write and writes/write count the servers' socket system calls per write: fewer
// than one each means requests and replies shared their TLS records and system calls.
//
// link=tls reaches all three replicas over TLS; link=file reaches the first, the replica on
// the target's node, over its server's local socket, as a node plugin does (LocalMember).
// With link=file the socket calls counted are the two TLS servers' only.
func BenchmarkEngineRandomWrite4KiB(b *testing.B) {
	for _, link := range []link{linkTLS, linkFile} {
		for _, inflight := range []int{1, 4, 16} {
			b.Run(fmt.Sprintf("link=%s/inflight=%d", link, inflight), func(b *testing.B) {
				var calls sockCalls
				c := newClusterWrapped(b, calls.wrap, link)
				c.startEngine()
				floor := floorOfWrites(b, inflight)
				b.SetBytes(4096)
				buf := make([]byte, 4096)
				before := calls.snapshot()
				b.ResetTimer()
				cpu := inFlight(b, inflight, b.N, func(rng *rand.Rand) error {
					_, err := c.e.WriteAt(buf, rng.Int64N(itSize/4096)*4096)
					return err
				})
				b.StopTimer()
				after := calls.snapshot()
				perWrite := float64(cpu.Microseconds()) / float64(b.N)
				b.ReportMetric(perWrite, "cpu-µs/write")
				b.ReportMetric(floor, "floor-µs/write")
				b.ReportMetric(perWrite/floor, "cpu/floor")
				b.ReportMetric(float64(after.reads-before.reads)/float64(b.N), "reads/write")
				b.ReportMetric(float64(after.writes-before.writes)/float64(b.N), "writes/write")
				c.checkLink(b, link)
			})
		}
	}
}

// BenchmarkEngineWrite1MiB is a volume's sequential write without the layers above the
// engine: 1 MiB writes, 16 in flight, in order over the volume, to three replica servers
// (member 0 over its local socket with link=file, as a node plugin reaches it; all three over
// TLS with link=tls). Its MB/s is what replication alone allows on this machine, where the
// three servers and the engine share its cores; cpu-µs/MiB is the process's CPU per MiB
// written, floor-µs/MiB that of the three 1 MiB pwrites into the replicas' file system that a
// MiB needs and nothing else, measured in the same run, and cpu/floor their ratio.
func BenchmarkEngineWrite1MiB(b *testing.B) {
	const block = 1 << 20
	for _, link := range []link{linkTLS, linkFile} {
		b.Run("link="+link.String(), func(b *testing.B) {
			c := newClusterWrapped(b, nil, link)
			c.startEngine()
			floor := floorOfWritesSized(b, 16, block, func(rng *rand.Rand, i int64) int64 { return i % (itSize / block) * block }, 200)
			data := make([]byte, block)
			for i := range data {
				data[i] = byte(i * 7)
			}
			var next atomic.Int64
			b.SetBytes(block)
			b.ResetTimer()
			start := time.Now()
			cpu := inFlight(b, 16, b.N, func(*rand.Rand) error {
				_, err := c.e.WriteAt(data, next.Add(1)%(itSize/block)*block)
				return err
			})
			took := time.Since(start)
			b.StopTimer()
			perMiB := float64(cpu.Microseconds()) / float64(b.N)
			b.ReportMetric(perMiB, "cpu-µs/MiB")
			b.ReportMetric(floor, "floor-µs/MiB")
			b.ReportMetric(perMiB/floor, "cpu/floor")
			b.ReportMetric(float64(b.N)*block/1e6/took.Seconds(), "MB/s")
			c.checkLink(b, link)
		})
	}
}

// BenchmarkEngineRead1MiB reads the volume 1 MiB at a time, 16 in flight, through the
// engine, which reads the replica on its own node (member 0): over TLS (link=tls), over the
// local socket (link=socket), or through a descriptor of the replica's file that the server
// handed over that socket (link=file, as a node plugin reads). floor-MB/s is pread of the
// same replica file in the same run, and link/floor the share of it the engine keeps.
func BenchmarkEngineRead1MiB(b *testing.B) {
	for _, link := range []link{linkTLS, linkSocket, linkFile} {
		b.Run("link="+link.String(), func(b *testing.B) {
			c := newClusterWrapped(b, nil, link)
			c.startEngine()
			data := make([]byte, itSize)
			for i := range data {
				data[i] = byte(i * 7)
			}
			if _, err := c.e.WriteAt(data, 0); err != nil {
				b.Fatal(err)
			}
			f, err := os.Open(c.nodes[0].path(c.ids[0]))
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			const block = 1 << 20
			read := func(n int, readAt func([]byte, int64) error) time.Duration {
				var seq atomic.Int64
				start := time.Now()
				var wg sync.WaitGroup
				var left atomic.Int64
				left.Store(int64(n))
				for range 16 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						buf := make([]byte, block)
						for left.Add(-1) >= 0 {
							if err := readAt(buf, (seq.Add(1)%(itSize/block))*block); err != nil {
								b.Error(err)
								return
							}
						}
					}()
				}
				wg.Wait()
				return time.Since(start)
			}
			floor := read(max(b.N, 1000), func(p []byte, off int64) error {
				_, err := f.ReadAt(p, off)
				return err
			})
			floorMBs := float64(max(b.N, 1000)) * block / 1e6 / floor.Seconds()
			b.SetBytes(block)
			b.ResetTimer()
			took := read(b.N, func(p []byte, off int64) error {
				_, err := c.e.ReadAt(p, off)
				return err
			})
			b.StopTimer()
			mbs := float64(b.N) * block / 1e6 / took.Seconds()
			b.ReportMetric(floorMBs, "floor-MB/s")
			b.ReportMetric(mbs/floorMBs, "link/floor")
			c.checkLink(b, link)
		})
	}
}

// checkLink fails b unless member 0 was reached as l says: a benchmark of the local link
// that fell back to TLS, or of the file that read over the socket, measures the wrong thing.
func (c *cluster) checkLink(b *testing.B, l link) {
	b.Helper()
	local, tls, files := c.localDials.Load(), c.tlsDials.Load(), c.fileOpens.Load()
	if l != linkTLS && (local == 0 || tls != 0) || l == linkTLS && local != 0 {
		b.Fatalf("member 0 dialed %d times over its local socket and %d over TLS", local, tls)
	}
	if (l == linkFile) != (files > 0) {
		b.Fatalf("member 0 read through its file in %d sessions, link=%s", files, l)
	}
}

// floorOfWrites measures the CPU of three 4 KiB pwrites at random offsets into three files of
// the replicas' file system, inflight at a time: what one replicated write cannot do without.
func floorOfWrites(b *testing.B, inflight int) float64 {
	return floorOfWritesSized(b, inflight, 4096, func(rng *rand.Rand, _ int64) int64 { return rng.Int64N(itSize/4096) * 4096 }, 20000)
}

// floorOfWritesSized is floorOfWrites for n writes of size bytes, the i-th (from 0) at
// offset at(rng, i): the CPU per replicated write, in µs.
func floorOfWritesSized(b *testing.B, inflight, size int, at func(rng *rand.Rand, i int64) int64, n int) float64 {
	b.Helper()
	dir := b.TempDir()
	var fds [3]int
	for i := range fds {
		fd, err := unix.Open(filepath.Join(dir, fmt.Sprint(i)), unix.O_CREAT|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
		if err != nil {
			b.Fatal(err)
		}
		defer unix.Close(fd)
		if err := unix.Ftruncate(fd, itSize); err != nil {
			b.Fatal(err)
		}
		fds[i] = fd
	}
	buf := make([]byte, size)
	var i atomic.Int64
	cpu := inFlight(b, inflight, n, func(rng *rand.Rand) error {
		off := at(rng, i.Add(1)-1)
		for _, fd := range fds {
			if _, err := unix.Pwrite(fd, buf, off); err != nil {
				return os.NewSyscallError("pwrite", err)
			}
		}
		return nil
	})
	return float64(cpu.Microseconds()) / float64(n)
}

// inFlight runs n calls of op, inflight at a time, and returns the CPU (user and system)
// the process spent meanwhile.
func inFlight(b *testing.B, inflight, n int, op func(*rand.Rand) error) time.Duration {
	b.Helper()
	start := cpuTime(b)
	var left atomic.Int64
	left.Store(int64(n))
	var wg sync.WaitGroup
	for g := range inflight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for left.Add(-1) >= 0 {
				if err := op(rng); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	return cpuTime(b) - start
}

func cpuTime(b *testing.B) time.Duration {
	b.Helper()
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// sockCalls counts the Read and Write calls on the connections a listener accepted: each is
// one system call on the socket (the TLS layer above reads and writes whole records).
type sockCalls struct{ r, w atomic.Int64 }

type sockCounts struct{ reads, writes int64 }

func (s *sockCalls) snapshot() sockCounts { return sockCounts{s.r.Load(), s.w.Load()} }

func (s *sockCalls) wrap(l net.Listener) net.Listener { return countingListener{l, s} }

type countingListener struct {
	net.Listener
	s *sockCalls
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return countingConn{c, l.s}, nil
}

type countingConn struct {
	net.Conn
	s *sockCalls
}

func (c countingConn) Read(p []byte) (int, error) {
	c.s.r.Add(1)
	return c.Conn.Read(p)
}

func (c countingConn) Write(p []byte) (int, error) {
	c.s.w.Add(1)
	return c.Conn.Write(p)
}
