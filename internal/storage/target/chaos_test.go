package target

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/crdipc/crdipc/internal/storage/replica"
	"github.com/crdipc/crdipc/internal/testenv/wait"
)

// TestStorageDataKillLoop is the storage kill loop on the data path: three real replica
// servers (RF 3, CF 2) and an engine writing them, while a chaos loop restarts one replica
// server at a time (an agent restart: same files, same address) and kills the engine (a
// target crash) and starts a new one, many of those landing while a replica is rebuilding
// (kill the engine, or restart the rebuild's source or the rebuilding replica's server),
// and now and then stops two servers at once, when no write may be acknowledged. Writers
// keep a model of the volume: per sector the last acknowledged content, plus the contents
// of writes that failed or were in flight at a crash since then (those may or may not have
// landed). At the end of a trial everything is restarted and must converge: all replicas
// healthy, every sector legal (an acknowledged sector never overwritten reads exactly as
// written), the three replica files byte-identical after a clean Close, and the same bytes
// again from a new engine.
//
// Trials and seed come from the environment; the seed of every trial is logged:
//
//	STORAGE_DATA_KILL_TRIALS=50 go test -run TestStorageDataKillLoop -v ./internal/storage/target/
//	STORAGE_DATA_KILL_SEED=<logged seed> STORAGE_DATA_KILL_TRIALS=1 go test -run TestStorageDataKillLoop -v ./internal/storage/target/
//
// The seed fixes the chaos actions and the written data, not the timing.
func TestStorageDataKillLoop(t *testing.T) {
	trials := 3
	if v := os.Getenv("STORAGE_DATA_KILL_TRIALS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("STORAGE_DATA_KILL_TRIALS=%q: want a positive number", v)
		}
		trials = n
	}
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("STORAGE_DATA_KILL_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("STORAGE_DATA_KILL_SEED=%q: %v", v, err)
		}
		seed = n
	}
	t.Logf("%d trials from seed %d (STORAGE_DATA_KILL_SEED=%d to repeat)", trials, seed, seed)
	var total chaosStats
	for i := range trials {
		s := seed + uint64(i)
		t.Run(fmt.Sprintf("seed=%d", s), func(t *testing.T) {
			st := runKillTrial(t, s)
			total.add(st)
		})
		if t.Failed() {
			t.Fatalf("trial with seed %d failed: STORAGE_DATA_KILL_SEED=%d STORAGE_DATA_KILL_TRIALS=1 repeats its actions", s, s)
		}
	}
	t.Logf("all trials: %s", total)
}

// Layout: four writers own a quarter each of the volume below the probe region, which only
// the chaos loop writes (the writes that must fail while two servers are down).
const (
	chaosWriters = 4
	probeSize    = 64 << 10
	probeOff     = itSize - probeSize
	writerRegion = (itSize - probeSize) / chaosWriters / SectorSize * SectorSize
)

type chaosStats struct {
	actions, engineKills, serverRestarts, duringRebuild, twoDown int
	acked, failed                                                int64
}

func (s *chaosStats) add(o chaosStats) {
	s.actions += o.actions
	s.engineKills += o.engineKills
	s.serverRestarts += o.serverRestarts
	s.duringRebuild += o.duringRebuild
	s.twoDown += o.twoDown
	s.acked += o.acked
	s.failed += o.failed
}

func (s chaosStats) String() string {
	return fmt.Sprintf("%d chaos actions: %d engine kills, %d server restarts, %d during a rebuild copy, %d with two servers down; %d writes acknowledged, %d failed",
		s.actions, s.engineKills, s.serverRestarts, s.duringRebuild, s.twoDown, s.acked, s.failed)
}

// sectorContent is what write id puts in sector sec: id and sec, then bytes derived from
// both, so a sector tells which write it came from and a torn or misplaced one shows.
// Write id 0 is the zeros of a never written sector.
func sectorContent(id uint64, sec int64) []byte {
	p := make([]byte, SectorSize)
	if id == 0 {
		return p
	}
	binary.LittleEndian.PutUint64(p, id)
	binary.LittleEndian.PutUint64(p[8:], uint64(sec))
	x := id*0x9E3779B97F4A7C15 ^ uint64(sec)
	for i := 16; i < SectorSize; i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(p[i:], x)
	}
	return p
}

// volumeModel holds, per sector, the write ids it may legally hold: the last acknowledged
// first, then every write that failed (or was cut by a crash) since. Each sector is only
// touched by the goroutine owning its region, and read by the checks once they stopped.
type volumeModel struct {
	legal [][]uint64
}

func newVolumeModel() *volumeModel {
	m := &volumeModel{legal: make([][]uint64, itSize/SectorSize)}
	for i := range m.legal {
		m.legal[i] = []uint64{0}
	}
	return m
}

func (m *volumeModel) acked(id uint64, off, n int64) {
	for s := off / SectorSize; s < (off+n)/SectorSize; s++ {
		m.legal[s] = append(m.legal[s][:0], id)
	}
}

func (m *volumeModel) failed(id uint64, off, n int64) {
	for s := off / SectorSize; s < (off+n)/SectorSize; s++ {
		m.legal[s] = append(m.legal[s], id)
	}
}

// check compares p, read at off, with the model and describes up to a few violations.
func (m *volumeModel) check(p []byte, off int64) []string {
	var bad []string
	lost := 0
	for i := int64(0); i < int64(len(p)); i += SectorSize {
		sec := (off + i) / SectorSize
		got := p[i : i+SectorSize]
		legal := m.legal[sec]
		ok := false
		for _, id := range legal {
			if bytes.Equal(got, sectorContent(id, sec)) {
				ok = true
				break
			}
		}
		if ok {
			continue
		}
		lost++
		if len(bad) < 5 {
			what := "holds neither its last acknowledged write nor a failed one since"
			if len(legal) == 1 {
				what = "acknowledged and never overwritten since, reads differently"
			}
			bad = append(bad, fmt.Sprintf("sector %d (offset %d) %s: legal writes %v, got write %d for sector %d",
				sec, sec*SectorSize, what, legal,
				binary.LittleEndian.Uint64(got), int64(binary.LittleEndian.Uint64(got[8:]))))
		}
	}
	if lost > len(bad) {
		bad = append(bad, fmt.Sprintf("... %d bad sectors in all", lost))
	}
	return bad
}

// engineBox holds the engine the writers use; changed is closed when it is replaced.
type engineBox struct {
	mu      sync.Mutex
	e       *Engine
	changed chan struct{}
}

func (b *engineBox) get() (*Engine, <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.e, b.changed
}

func (b *engineBox) set(e *Engine) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.e = e
	close(b.changed)
	b.changed = make(chan struct{})
}

type killTrial struct {
	t     *testing.T
	rng   *rand.Rand // the chaos loop's
	c     *cluster
	model *volumeModel
	box   engineBox
	ids   atomic.Uint64 // write ids
	acks  atomic.Int64  // acknowledged writes
	fails atomic.Int64
	// twoDown is odd while two servers are stopped: a write that starts and ends within
	// one odd value must fail.
	twoDown atomic.Int64
	down    []bool // by the chaos loop: which servers are stopped
	stats   chaosStats
	stop    chan struct{}
}

func runKillTrial(t *testing.T, seed uint64) chaosStats {
	start := time.Now()
	kt := &killTrial{
		t:     t,
		rng:   rand.New(rand.NewPCG(seed, 0xC4A05)),
		model: newVolumeModel(),
		stop:  make(chan struct{}),
		box:   engineBox{changed: make(chan struct{})},
	}
	// Small copy steps, one at a time, so a rebuild of the few MiB written takes long
	// enough for kills to land in the middle of it.
	kt.c = newCluster(t, func(o *replica.ServerOptions) {
		o.RebuildChunk = 8 << 10
		o.RebuildParallel = 1
		o.PeerTimeout = 5 * time.Second
	})
	kt.down = make([]bool, len(kt.c.nodes))
	kt.box.set(kt.newEngine())

	var wg sync.WaitGroup
	for w := range chaosWriters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			kt.writer(rand.New(rand.NewPCG(seed, uint64(w))), int64(w)*writerRegion)
		}()
	}
	writersDone := false
	stopWriters := func() {
		if !writersDone {
			writersDone = true
			close(kt.stop)
			wg.Wait()
		}
	}
	defer stopWriters() // on a Fatal in the chaos loop

	actions := 8 + kt.rng.IntN(5)
	for range actions {
		kt.waitAcks(int64(20+kt.rng.IntN(200)), time.Duration(50+kt.rng.IntN(200))*time.Millisecond)
		kt.chaos()
		kt.stats.actions++
	}
	kt.waitAcks(50, 500*time.Millisecond)
	stopWriters()
	kt.stats.acked, kt.stats.failed = kt.acks.Load(), kt.fails.Load()
	kt.verify()
	t.Logf("%s in %v; node-0's replica reached %d times over its local socket, %d over TLS, read through its file in %d sessions", kt.stats, time.Since(start).Round(time.Millisecond), kt.c.localDials.Load(), kt.c.tlsDials.Load(), kt.c.fileOpens.Load())
	if kt.c.localDials.Load() == 0 {
		t.Error("the target never reached the replica on its node over the local socket")
	}
	if kt.c.fileOpens.Load() == 0 {
		t.Error("the target never read the replica on its node through its file")
	}
	return kt.stats
}

// writer does random aligned writes in its region until stopped, and now and then reads
// part of the region back and checks it against the model.
func (kt *killTrial) writer(rng *rand.Rand, base int64) {
	for {
		select {
		case <-kt.stop:
			return
		default:
		}
		e, changed := kt.box.get()
		if e == nil {
			select {
			case <-changed:
			case <-kt.stop:
				return
			}
			continue
		}
		if rng.IntN(10) == 0 {
			kt.readBack(e, rng, base)
			continue
		}
		sectors := 1 + rng.IntN(32)
		if rng.IntN(20) == 0 {
			sectors = 64 + rng.IntN(448) // up to 256 KiB
		}
		n := int64(sectors) * SectorSize
		off := base + rng.Int64N((writerRegion-n)/SectorSize+1)*SectorSize
		id := kt.ids.Add(1)
		p := make([]byte, 0, n)
		for s := off / SectorSize; s < (off+n)/SectorSize; s++ {
			p = append(p, sectorContent(id, s)...)
		}
		before := kt.twoDown.Load()
		_, err := e.WriteAt(p, off)
		after := kt.twoDown.Load()
		if err == nil {
			if before == after && before%2 == 1 {
				kt.t.Errorf("write %d of %d bytes at %d acknowledged while two of three replica servers were stopped", id, n, off)
			}
			kt.model.acked(id, off, n)
			kt.acks.Add(1)
			continue
		}
		kt.model.failed(id, off, n)
		kt.fails.Add(1)
		switch {
		case errors.Is(err, ErrClosed):
			// Killed: wait for the next engine.
			select {
			case <-changed:
			case <-kt.stop:
				return
			}
		case errors.Is(err, ErrNoQuorum):
			// Wait (a little) for the rebuilds or the stopped servers to come back.
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			_ = e.WaitQuorum(ctx)
			cancel()
		default:
			kt.t.Errorf("write %d of %d bytes at %d: %v; want success, ErrNoQuorum or ErrClosed", id, n, off, err)
			return
		}
	}
}

func (kt *killTrial) readBack(e *Engine, rng *rand.Rand, base int64) {
	n := int64(1+rng.IntN(256)) * SectorSize
	off := base + rng.Int64N((writerRegion-n)/SectorSize+1)*SectorSize
	p := make([]byte, n)
	if _, err := e.ReadAt(p, off); err != nil {
		if !errors.Is(err, ErrClosed) && !errors.Is(err, ErrUnavailable) {
			kt.t.Errorf("read of %d bytes at %d: %v; want success, ErrUnavailable or ErrClosed", n, off, err)
		}
		return
	}
	for _, b := range kt.model.check(p, off) {
		kt.t.Errorf("read back during the chaos: %s", b)
	}
}

// waitAcks waits until n more writes were acknowledged or limit passed (progress may be
// impossible for a while, e.g. right after a crash).
func (kt *killTrial) waitAcks(n int64, limit time.Duration) {
	want := kt.acks.Load() + n
	_ = wait.Until(context.Background(), limit, func(context.Context) (bool, error) {
		return kt.acks.Load() >= want, nil
	})
}

// pause lets the writers acknowledge a random number of writes (or try for a moment, when
// they cannot) before the next chaos step. It orders nothing; it varies where steps land.
func (kt *killTrial) pause() {
	kt.waitAcks(int64(kt.rng.IntN(40)), 40*time.Millisecond)
}

// newEngine starts an engine on the three replicas. It retries while New finds fewer than
// CF complete replicas: after a crash during rebuilds, copiers that outlived their engine
// may still be finishing.
func (kt *killTrial) newEngine() *Engine {
	kt.t.Helper()
	var e *Engine
	err := wait.Until(context.Background(), 30*time.Second, func(context.Context) (bool, error) {
		var err error
		e, err = New(context.Background(), Options{
			Members:           kt.c.members,
			ConsistencyFactor: 2,
			IOTimeout:         5 * time.Second,
			RejoinInterval:    20 * time.Millisecond,
		})
		if err != nil && !errors.Is(err, ErrNoQuorum) {
			kt.t.Fatalf("starting an engine: %v; replicas: %s", err, kt.describe())
		}
		return err == nil, err // without quorum, copiers may still be finishing
	})
	if err != nil {
		kt.t.Fatalf("starting an engine: %v; replicas: %s", err, kt.describe())
	}
	kt.t.Cleanup(func() { _ = e.Close() })
	return e
}

// info asks server i directly for its replica's state.
func (kt *killTrial) info(i int) (replica.Info, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := replica.Dial(ctx, kt.c.nodes[i].addr, kt.c.client)
	if err != nil {
		return replica.Info{}, err
	}
	defer conn.Close()
	return conn.Replica(kt.c.ids[i]).Info(ctx)
}

func (kt *killTrial) describe() string {
	var b strings.Builder
	for i := range kt.c.nodes {
		if kt.down[i] {
			fmt.Fprintf(&b, "\n  %s: server stopped", kt.c.ids[i])
			continue
		}
		in, err := kt.info(i)
		if err != nil {
			fmt.Fprintf(&b, "\n  %s: %v", kt.c.ids[i], err)
			continue
		}
		fmt.Fprintf(&b, "\n  %s: %+v", kt.c.ids[i], in)
	}
	return b.String()
}

func (kt *killTrial) stopNode(i int) {
	kt.t.Helper()
	kt.c.nodes[i].stop()
	kt.down[i] = true
}

func (kt *killTrial) startNode(i int) {
	kt.t.Helper()
	kt.c.nodes[i].start()
	kt.down[i] = false
	kt.stats.serverRestarts++
}

// killEngine crashes the engine and starts a new one on the same replicas.
func (kt *killTrial) killEngine() {
	kt.t.Helper()
	e, _ := kt.box.get()
	kt.box.set(nil)
	kill(e)
	kt.stats.engineKills++
	kt.box.set(kt.newEngine())
}

// waitStates waits until cond holds for the current engine's states; false if it did not
// within d.
func (kt *killTrial) waitStates(d time.Duration, cond func(map[string]Status) bool) (map[string]Status, bool) {
	e, _ := kt.box.get()
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		e.mu.Lock()
		st := e.snapshotStatesLocked()
		ch := e.changed
		e.mu.Unlock()
		if cond(st) {
			return st, true
		}
		select {
		case <-ch:
		case <-timer.C:
			return st, false
		}
	}
}

// rebuilding returns a replica the engine reports Rebuilding, waiting for one up to d.
func (kt *killTrial) rebuilding(d time.Duration) (int, bool) {
	st, ok := kt.waitStates(d, func(st map[string]Status) bool {
		for _, s := range st {
			if s.State == Rebuilding {
				return true
			}
		}
		return false
	})
	if !ok {
		return -1, false
	}
	var idx []int
	for i, id := range kt.c.ids {
		if st[id].State == Rebuilding {
			idx = append(idx, i)
		}
	}
	return idx[kt.rng.IntN(len(idx))], true
}

// midCopy reports whether replica i's copier is running now, and which server it copies
// from (-1 if unknown).
func (kt *killTrial) midCopy(i int) (bool, int) {
	in, err := kt.info(i)
	if err != nil || !in.Rebuilding || in.RebuildError != "" {
		return false, -1
	}
	src := -1
	addr, _, _ := strings.Cut(in.RebuildSource, "/")
	for j, n := range kt.c.nodes {
		if n.addr == addr {
			src = j
		}
	}
	return in.RebuildDone < in.RebuildTotal || in.RebuildTotal == 0, src
}

// chaos runs one random step. Every step leaves all servers running and an engine in the
// box; rebuilds it started may still run.
func (kt *killTrial) chaos() {
	kt.t.Helper()
	n := len(kt.c.nodes)
	switch a := kt.rng.IntN(10); {
	case a < 2: // an agent restart
		i := kt.rng.IntN(n)
		kt.stopNode(i)
		kt.pause()
		kt.startNode(i)

	case a < 4: // a target crash; sometimes again while the new engine rebuilds
		kt.killEngine()
		if kt.rng.IntN(2) == 0 {
			kt.duringRebuild()
		}

	case a < 9: // an agent restart, and then something dies while that replica rebuilds
		i := kt.rng.IntN(n)
		kt.stopNode(i)
		kt.pause()
		kt.startNode(i)
		kt.duringRebuild()

	default: // two agents down at once: nothing may be acknowledged
		i := kt.rng.IntN(n)
		j := (i + 1 + kt.rng.IntN(n-1)) % n
		kt.stopNode(i)
		kt.stopNode(j)
		kt.twoDown.Add(1)
		kt.stats.twoDown++
		kt.probeWrite()
		kt.pause()
		kt.twoDown.Add(1)
		kt.startNode(i)
		kt.startNode(j)
	}
}

// probeWrite writes the probe region while two servers are stopped: it must fail with
// ErrNoQuorum (what it may have left on the third replica is legal, as for a torn write).
func (kt *killTrial) probeWrite() {
	kt.t.Helper()
	e, _ := kt.box.get()
	n := int64(1+kt.rng.IntN(probeSize/SectorSize)) * SectorSize
	off := probeOff + kt.rng.Int64N((probeSize-n)/SectorSize+1)*SectorSize
	id := kt.ids.Add(1)
	p := make([]byte, 0, n)
	for s := off / SectorSize; s < (off+n)/SectorSize; s++ {
		p = append(p, sectorContent(id, s)...)
	}
	_, err := e.WriteAt(p, off)
	if err == nil {
		kt.model.acked(id, off, n)
		kt.t.Errorf("write of %d bytes at %d acknowledged with two of three replica servers stopped", n, off)
		return
	}
	kt.model.failed(id, off, n)
	if !errors.Is(err, ErrNoQuorum) {
		kt.t.Errorf("write with two of three replica servers stopped: %v, want ErrNoQuorum", err)
	}
}

// duringRebuild waits until the engine reports a replica Rebuilding and then kills the
// engine, or restarts the rebuild's source, or the rebuilding replica's server.
func (kt *killTrial) duringRebuild() {
	kt.t.Helper()
	i, ok := kt.rebuilding(10 * time.Second)
	if !ok {
		return // no rebuild (e.g. clean replicas, or it finished between two looks)
	}
	if kt.rng.IntN(3) == 0 {
		kt.pause()
	}
	mid, src := kt.midCopy(i)
	if mid {
		kt.stats.duringRebuild++
	}
	switch a := kt.rng.IntN(3); {
	case a == 0:
		kt.killEngine()
	case a == 1 && src >= 0:
		kt.stopNode(src)
		kt.pause()
		kt.startNode(src)
	default:
		kt.stopNode(i)
		kt.pause()
		kt.startNode(i)
	}
}

// verify restarts everything and checks that the volume converged without corruption.
func (kt *killTrial) verify() {
	t := kt.t
	t.Helper()
	e, _ := kt.box.get()
	kt.box.set(nil)
	if kt.rng.IntN(2) == 0 {
		kill(e)
	} else if err := e.Close(); err != nil {
		t.Logf("closing the last chaos engine: %v", err) // a faulted replica's session is gone
	}
	for i := range kt.c.nodes {
		kt.stopNode(i)
	}
	for i := range kt.c.nodes {
		kt.startNode(i)
	}
	e = kt.newEngine()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.WaitQuorum(ctx); err != nil {
		t.Fatalf("WaitQuorum after restarting everything: %v; replicas: %s", err, kt.describe())
	}
	kt.box.set(e)
	if st, ok := kt.waitStates(30*time.Second, allHealthy); !ok {
		t.Fatalf("replicas not all healthy 30 s after restarting everything: %v; replicas: %s", st, kt.describe())
	}
	vol := make([]byte, itSize)
	if _, err := e.ReadAt(vol, 0); err != nil {
		t.Fatalf("reading the volume: %v", err)
	}
	bad := kt.model.check(vol, 0)
	for _, b := range bad {
		t.Errorf("after convergence: %s", b)
	}
	if err := e.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	sums := make([][32]byte, len(kt.c.nodes))
	for i, n := range kt.c.nodes {
		sums[i] = n.sha(kt.c.ids[i])
	}
	for i := 1; i < len(sums); i++ {
		if sums[i] != sums[0] {
			t.Errorf("replica files differ after a clean Close: %s %x, %s %x", kt.c.ids[0], sums[0][:8], kt.c.ids[i], sums[i][:8])
		}
	}

	// Durable across a clean restart: every replica is healthy at once, same bytes.
	e = kt.newEngine()
	kt.box.set(e)
	for id, s := range e.States() {
		if s.State != Healthy {
			t.Errorf("after a clean Close and New, %s is %s (%v), want Healthy at once", id, s.State, s.Err)
		}
	}
	again := make([]byte, itSize)
	if _, err := e.ReadAt(again, 0); err != nil {
		t.Fatalf("reading the volume again: %v", err)
	}
	if !bytes.Equal(again, vol) {
		t.Error("the volume reads differently after a clean Close and restart")
	}
	if err := e.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

func allHealthy(st map[string]Status) bool {
	for _, s := range st {
		if s.State != Healthy {
			return false
		}
	}
	return true
}

// A target crash while every other replica rebuilds, then every node restarting (which
// stops the copiers): only the rebuilds' source is complete, and it holds every
// acknowledged write, so a new engine must start from it rather than wait for a quorum of
// complete replicas that can never come.
func TestCrashDuringRebuildsThenNodesRestart(t *testing.T) {
	c := newCluster(t, func(o *replica.ServerOptions) {
		o.RebuildChunk = 4 << 10 // a slow copy: the restarts below land in the middle of it
		o.RebuildParallel = 1
	})
	c.startEngine()
	c.h.waitAllHealthy()
	p := make([]byte, itSize)
	for s := int64(0); s < itSize/SectorSize; s++ {
		copy(p[s*SectorSize:], sectorContent(uint64(1+s%7), s))
	}
	if _, err := c.e.WriteAt(p, 0); err != nil {
		t.Fatal(err)
	}
	kill(c.e) // every replica dirty: the next engine rebuilds two of them
	c.startEngine()
	st := c.e.States()
	var src string
	for id, s := range st {
		if s.State == Healthy {
			src = id
		}
	}
	// The engine starts its rebuilds in the background: kill it once both copies run.
	wait.Eventually(t, 10*time.Second, "both copies running", func(context.Context) (bool, error) {
		copying := 0
		for _, info := range c.infos(t) {
			if info.Rebuilding && info.RebuildDone < info.RebuildTotal {
				copying++
			}
		}
		if copying != 2 {
			return false, fmt.Errorf("%d copies running", copying)
		}
		return true, nil
	})
	kill(c.e)
	for _, n := range c.nodes {
		n.stop()
	}
	for _, n := range c.nodes {
		n.start()
	}
	rebuilding := 0
	for i, info := range c.infos(t) {
		if info.Rebuilding {
			rebuilding++
			if _, from, _ := strings.Cut(info.RebuildSource, "/"); from != src {
				t.Errorf("%s rebuilding from %q after a restart, want %s", c.ids[i], info.RebuildSource, src)
			}
		}
	}
	if rebuilding != 2 {
		t.Fatalf("%d replicas left rebuilding, want 2 (the copies finished before the restarts?)", rebuilding)
	}
	c.startEngine()
	if err := c.e.WaitQuorum(t.Context()); err != nil {
		t.Fatal(err)
	}
	c.h.waitAllHealthy()
	c.exp = p
	c.checkRead()
	c.checkFiles()
	if err := c.e.Close(); err != nil {
		t.Fatal(err)
	}
}

// The same in a running engine: after a crash its source is the only healthy replica while
// the two others rebuild from it; the source's node restarts (the copiers fail). No replica
// is healthy and only one is complete: the engine must take it back as the source.
//
// Member 0's reads go over its socket here: the engine is to notice the stopped source on a
// read, and a read through the replica's file still succeeds while its server is down (the
// file holds every write acknowledged, and the next write faults the replica).
func TestSourceRestartsWhileTheOthersRebuild(t *testing.T) {
	c := newClusterWrapped(t, nil, linkSocket, func(o *replica.ServerOptions) {
		o.RebuildChunk = 4 << 10
		o.RebuildParallel = 1
	})
	c.startEngine()
	c.h.waitAllHealthy()
	p := make([]byte, itSize)
	for s := int64(0); s < itSize/SectorSize; s++ {
		copy(p[s*SectorSize:], sectorContent(uint64(1+s%5), s))
	}
	if _, err := c.e.WriteAt(p, 0); err != nil {
		t.Fatal(err)
	}
	kill(c.e)
	c.startEngine()
	src := -1
	for i, id := range c.ids {
		if c.e.States()[id].State == Healthy {
			src = i
		}
	}
	if st := c.e.States(); st[c.ids[(src+1)%3]].State != Rebuilding || st[c.ids[(src+2)%3]].State != Rebuilding {
		t.Fatalf("after the crash: %v, want the two replicas other than %s rebuilding", st, c.ids[src])
	}
	c.nodes[src].stop()
	// The engine notices on its next read, which nothing else can serve.
	if _, err := c.e.ReadAt(make([]byte, SectorSize), 0); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("read with the only healthy replica stopped: %v, want ErrUnavailable", err)
	}
	c.h.waitState(c.ids[src], Faulted)
	c.nodes[src].start()
	c.h.waitAllHealthy()
	c.exp = p
	c.checkRead()
	c.checkFiles()
	if err := c.e.Close(); err != nil {
		t.Fatal(err)
	}
}

// A replica's revision must not go back when its writer dies (nor when its server
// restarts): the data stays, and an older revision would let a replica that missed it look
// at least as fresh at the next start.
func TestRevisionOutlivesTargetCrashAndServerRestart(t *testing.T) {
	c := newCluster(t)
	c.startEngine()
	c.h.waitAllHealthy()
	for i := range 10 {
		if _, err := c.e.WriteAt(sectorContent(uint64(i+1), int64(i)), int64(i)*SectorSize); err != nil {
			t.Fatal(err)
		}
	}
	c.e.mu.Lock()
	want := c.e.rev
	c.e.mu.Unlock()
	kill(c.e)
	infos := c.infos(t)
	wait.Eventually(t, 10*time.Second, "the dead target's sessions gone", func(context.Context) (bool, error) {
		infos = c.infos(t)
		return noSession(infos)
	})
	for i, n := range c.nodes {
		if infos[i].Revision != want {
			t.Errorf("%s at revision %d after its writer died, want %d", c.ids[i], infos[i].Revision, want)
		}
		n.stop()
		n.start()
	}
	c.startEngine()
	for id, s := range c.e.States() {
		if s.Revision != want {
			t.Errorf("%s at revision %d after its server restarted, want %d", id, s.Revision, want)
		}
	}
}
