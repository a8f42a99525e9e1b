package backup

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

var modelLogLines = 60

var (
	modelRuns = flag.Int("model.runs", 10000, "interleavings TestPruneModel runs")
	modelSeed = flag.Uint64("model.seed", 0, "first seed of TestPruneModel (0: from the clock)")
)

const (
	modelChunk   = 4096             // smaller than a store may have: set after Open
	modelTimeout = 10 * time.Second // the store's pending timeout
)

// TestPruneModel runs backups, restores, deletions and prunes of the real code against a
// store in memory, one store operation at a time in an order a seeded random scheduler
// picks, with faults at every step: a failed PUT, GET, LIST or DELETE (before or after it
// took effect), a process killed between two operations, markers left unrenewed, and the
// clock moved on by more than the pending timeout. After every step every manifest's chunks
// must have a copy, and so must every chunk a running restore (whose marker was kept fresh)
// may still read; at the end every backup restores to what was backed up. A failure prints
// the seed: -model.seed=N -model.runs=1 runs it again.
func TestPruneModel(t *testing.T) {
	runs := *modelRuns
	if testing.Short() {
		runs = min(runs, 1000)
	}
	seed := *modelSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	pal := newPalette(seed)
	var total modelStats
	start := time.Now()
	for i := range runs {
		s := seed + uint64(i)
		st, err := runModel(s, pal)
		if err != nil {
			t.Fatalf("seed %d (go test -run TestPruneModel -model.seed=%d -model.runs=1 ./internal/storage/backup): %v", s, s, err)
		}
		total.add(st)
	}
	t.Logf("%d interleavings from seed %d in %s: %+v", runs, seed, time.Since(start).Round(time.Millisecond), total)
	// The model must reach the cases it is for, else it proves nothing.
	if runs >= 1000 && (total.Deleted == 0 || total.Manifests == 0 || total.StaleFailed == 0 || total.Reads == 0 || total.Waiting == 0 || total.Killed == 0) {
		t.Fatalf("the model did not reach every case: %+v", total)
	}
}

type modelStats struct {
	Steps, Manifests, BackupsFailed, StaleFailed, Deleted, Epochs, Waiting, Reads, Killed int
}

func (s *modelStats) add(o modelStats) {
	s.Steps += o.Steps
	s.Manifests += o.Manifests
	s.BackupsFailed += o.BackupsFailed
	s.StaleFailed += o.StaleFailed
	s.Deleted += o.Deleted
	s.Epochs += o.Epochs
	s.Waiting += o.Waiting
	s.Reads += o.Reads
	s.Killed += o.Killed
}

// palette is the chunk contents volumes are made of: few, so that backups share chunks.
type palette [][]byte

func newPalette(seed uint64) palette {
	rng := rand.New(rand.NewPCG(seed, 1))
	var p palette
	for range 8 {
		b := make([]byte, modelChunk)
		for i := range b {
			b[i] = byte(rng.UintN(256))
		}
		p = append(p, b)
	}
	return append(p, make([]byte, modelChunk)) // and zeros
}

// volume is 5 chunks: most drawn from the palette, some new.
func (p palette) volume(rng *rand.Rand) []byte {
	var v []byte
	for range 5 {
		if rng.IntN(10) < 3 {
			fresh := make([]byte, modelChunk)
			for i := 0; i < len(fresh); i += 8 {
				binary.LittleEndian.PutUint64(fresh[i:], rng.Uint64())
			}
			v = append(v, fresh...)
			continue
		}
		v = append(v, p[rng.IntN(len(p))]...)
	}
	return v
}

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

type actorKey struct{}

type actorState int

const (
	running actorState = iota
	parked
	finished
)

// actor is one process: a backup, a restore, a deletion or prunes.
type actor struct {
	name     string
	state    actorState
	op       string
	killed   bool
	grant    chan Fault
	sessions []*session
	reader   *Reader // a restore's, while it reads
}

type model struct {
	rng    *rand.Rand
	clock  *fakeClock
	store  *MemStore
	repo   *Repository
	mu     sync.Mutex
	cond   *sync.Cond
	actors []*actor
	// want is what each backup ID holds, for the check at the end.
	want  map[string][]byte
	log   []logLine
	stats modelStats
	// checked and checkedAt: the store's changes and the time at the last check.
	checked   int64
	checkedAt time.Time
	// manifests caches the chunks of each manifest object's contents.
	manifests map[string][]string
	fail      error // found by an actor
}

func runModel(seed uint64, pal palette) (modelStats, error) {
	m := &model{
		rng:   rand.New(rand.NewPCG(seed, 2)),
		clock: &fakeClock{t: time.Now().Add(1000 * time.Hour).Truncate(time.Second)}, // past any real deadline
		want:  map[string][]byte{},

		manifests: map[string][]string{},
	}
	m.cond = sync.NewCond(&m.mu)
	m.store = NewMemStore(m.clock.Now)
	m.store.Deadlines = true
	ctx := context.Background()
	key := bytes.Repeat([]byte{7}, 32)
	repo, err := Open(ctx, m.store, key, InitOptions{ChunkSize: minChunk, PendingTimeout: modelTimeout})
	if err != nil {
		return m.stats, err
	}
	repo.now, repo.manualRenewals, repo.chunkSize = m.clock.Now, true, modelChunk
	repo.sessionHook = func(ctx context.Context, s *session) {
		if a, _ := ctx.Value(actorKey{}).(*actor); a != nil {
			m.mu.Lock()
			a.sessions = append(a.sessions, s)
			m.mu.Unlock()
		}
	}
	m.repo = repo
	m.store.Hook = m.hook

	// What the store holds before: two backups, and one deleted, whose chunks a prune
	// condemned (or two prunes, and the second deleted them), or none did yet.
	for _, id := range []string{"a", "b", "c"} {
		v := pal.volume(m.rng)
		m.want[id] = v
		if _, err := repo.Backup(ctx, bytes.NewReader(v), int64(len(v)), BackupOptions{ID: id, Volume: "v" + id, Concurrency: 1}); err != nil {
			return m.stats, err
		}
	}
	if err := repo.Delete(ctx, "c"); err != nil {
		return m.stats, err
	}
	for range m.rng.IntN(3) {
		if _, err := repo.Prune(ctx, PruneOptions{}); err != nil {
			return m.stats, err
		}
		m.clock.advance(modelTimeout)
	}

	ids := []string{"a", "b"}
	for i := range 2 + m.rng.IntN(2) {
		id := fmt.Sprintf("n%d", i)
		if m.rng.IntN(3) == 0 {
			id = "n0" // the same backup again: a retry that resumes
		}
		v := pal.volume(m.rng)
		if old, ok := m.want[id]; ok {
			v = old
		}
		m.want[id] = v
		ids = append(ids, id)
		m.spawn("backup "+id, func(ctx context.Context) {
			src := &slowVolume{m: m, ctx: ctx, r: bytes.NewReader(v)}
			_, err := repo.Backup(ctx, src, int64(len(v)), BackupOptions{ID: id, Volume: "v" + id, Concurrency: 1})
			if err != nil {
				// Tried again, as the agent does: it resumes.
				_, err = repo.Backup(ctx, src, int64(len(v)), BackupOptions{ID: id, Volume: "v" + id, Concurrency: 1})
			}
			m.mu.Lock()
			defer m.mu.Unlock()
			switch {
			case err == nil:
				m.stats.Manifests++
			case strings.Contains(err.Error(), "without renewal"):
				m.stats.StaleFailed++
			default:
				m.stats.BackupsFailed++
			}
		})
	}
	if m.rng.IntN(4) > 0 {
		wait := m.rng.IntN(30)
		m.spawn("restore", func(ctx context.Context) {
			// Parked at least once before it draws from m.rng: until the scheduler runs, this
			// goroutine and the one setting the model up would share it.
			for i := range wait + 1 { // starts later
				m.hook(ctx, "wait", fmt.Sprint(i))
			}
			m.restore(ctx, m.pick(ids))
		})
	}
	wait := m.rng.IntN(40)
	m.spawn("delete", func(ctx context.Context) {
		for i := range wait + 1 { // deletes later (and parked before it draws, as restore)
			m.hook(ctx, "wait", fmt.Sprint(i))
		}
		for range 2 {
			_ = repo.Delete(ctx, m.pick(ids))
			for i := range 10 {
				m.hook(ctx, "wait", fmt.Sprint(i))
			}
		}
	})
	for p := range 1 + m.rng.IntN(2) {
		m.spawn(fmt.Sprintf("prune %d", p), func(ctx context.Context) {
			for i := range 8 {
				for j := range 8 { // prunes now and then
					m.hook(ctx, "wait", fmt.Sprint(i, j))
				}
				res, err := repo.Prune(ctx, PruneOptions{})
				if err == nil {
					m.mu.Lock()
					m.stats.Deleted += res.Deleted
					if res.Epoch > 0 {
						m.stats.Epochs++
					}
					if len(res.Waiting) > 0 {
						m.stats.Waiting++
					}
					m.mu.Unlock()
				}
			}
		})
	}

	if err := m.schedule(); err != nil {
		return m.stats, fmt.Errorf("%w\nsteps:\n%s", err, m.steps())
	}
	// Every backup that exists restores to what it was made of.
	for _, k := range m.store.Keys(backupsPrefix) {
		id := strings.TrimSuffix(strings.TrimPrefix(k, backupsPrefix), manifestSuffix)
		var out memFile
		_, err := repo.Restore(ctx, id, &out, RestoreOptions{Concurrency: 1, WriteZeros: true})
		for try := 0; errors.Is(err, errPruning) && try < 3; try++ {
			// A chunk whose only copy an epoch names for deletion, though a manifest lists
			// it (its prune found a backup of an older epoch running, and deleted nothing):
			// restored once a newer epoch no longer names it.
			m.clock.advance(modelTimeout)
			if _, err := repo.Prune(ctx, PruneOptions{}); err != nil {
				return m.stats, err
			}
			_, err = repo.Restore(ctx, id, &out, RestoreOptions{Concurrency: 1, WriteZeros: true})
		}
		if err != nil {
			return m.stats, fmt.Errorf("backup %s does not restore: %w\nsteps:\n%s", id, err, m.steps())
		}
		if !bytes.Equal(out.b, m.want[id]) {
			return m.stats, fmt.Errorf("backup %s restores to other data", id)
		}
	}
	return m.stats, nil
}

// pick is one of the backups the store holds now, or of ids if it holds none (the actor
// runs alone when it picks).
func (m *model) pick(ids []string) string {
	var have []string
	for _, k := range m.store.Keys(backupsPrefix) {
		have = append(have, strings.TrimSuffix(strings.TrimPrefix(k, backupsPrefix), manifestSuffix))
	}
	if len(have) == 0 {
		have = ids
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return have[m.rng.IntN(len(have))]
}

// restore reads backup id through a Reader, chunk by chunk, as a replica fill does. A chunk
// that went missing while its marker was kept fresh breaks the invariant.
func (m *model) restore(ctx context.Context, id string) {
	rd, err := m.repo.Reader(ctx, id)
	if err != nil {
		return
	}
	a := ctx.Value(actorKey{}).(*actor)
	m.mu.Lock()
	a.reader = rd
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		a.reader = nil
		m.mu.Unlock()
		rd.Close()
	}()
	buf := make([]byte, modelChunk)
	for i := range rd.Manifest().Chunks {
		for range 3 { // writing a chunk into the replica takes long
			if m.hook(ctx, "write replica", fmt.Sprint(i)) != NoFault {
				return
			}
		}
		for try := 0; ; try++ {
			err := rd.ReadAt(ctx, buf, int64(i)*modelChunk)
			if err == nil {
				m.mu.Lock()
				m.stats.Reads++
				m.mu.Unlock()
				break
			}
			var ce *ChunkError
			if errors.As(err, &ce) && errors.Is(err, ErrNotFound) && rd.sess.fresh() == nil {
				m.mu.Lock()
				if m.fail == nil {
					m.fail = fmt.Errorf("restore of %s, its marker fresh, lost a chunk: %w", id, err)
				}
				m.mu.Unlock()
				return
			}
			if try == 3 {
				return
			}
		}
	}
}

// slowVolume is a volume each read of which is a step: backups take long, as they do.
type slowVolume struct {
	m   *model
	ctx context.Context
	r   *bytes.Reader
}

func (v *slowVolume) ReadAt(p []byte, off int64) (int, error) {
	if v.m.hook(v.ctx, "read volume", fmt.Sprint(off)) != NoFault && v.ctx.Value(actorKey{}).(*actor).killed {
		return 0, errInjected
	}
	return v.r.ReadAt(p, off)
}

type memFile struct{ b []byte }

func (f *memFile) WriteAt(p []byte, off int64) (int, error) {
	if need := off + int64(len(p)); need > int64(len(f.b)) {
		f.b = append(f.b, make([]byte, need-int64(len(f.b)))...)
	}
	return copy(f.b[off:], p), nil
}

func (m *model) spawn(name string, fn func(context.Context)) {
	a := &actor{name: name, grant: make(chan Fault)}
	m.mu.Lock()
	m.actors = append(m.actors, a)
	m.mu.Unlock()
	go func() {
		fn(context.WithValue(context.Background(), actorKey{}, a))
		m.mu.Lock()
		a.state = finished
		m.cond.Broadcast()
		m.mu.Unlock()
	}()
}

// hook parks an actor's operation until the scheduler picks it.
func (m *model) hook(ctx context.Context, op, key string) Fault {
	a, _ := ctx.Value(actorKey{}).(*actor)
	if a == nil {
		return NoFault // the model's own reads, and the setup
	}
	m.mu.Lock()
	if a.killed {
		m.mu.Unlock()
		return FailBefore // a dead process does nothing more
	}
	a.state, a.op = parked, op+" "+key
	m.cond.Broadcast()
	m.mu.Unlock()
	return <-a.grant
}

// schedule runs the actors to their end, one step at a time, checking after each.
func (m *model) schedule() error {
	for step := 0; ; step++ {
		m.mu.Lock()
		for !m.quiet() {
			m.cond.Wait()
		}
		var waiting, alive []*actor
		for _, a := range m.actors {
			if a.state == parked {
				waiting = append(waiting, a)
			}
			if a.state != finished && !a.killed {
				alive = append(alive, a)
			}
		}
		fail := m.fail
		m.mu.Unlock()
		if fail != nil {
			return fail
		}
		if err := m.check(); err != nil {
			return err
		}
		if len(waiting) == 0 {
			m.stats.Steps += step
			return nil
		}
		if step > 5000 {
			return errors.New("no end after 5000 steps")
		}
		switch r := m.rng.IntN(1000); {
		case r < 200:
			// Time passes; the heartbeats renew the markers, most of the time.
			d := time.Duration(m.rng.IntN(3000)) * time.Millisecond
			m.clock.advance(d)
			m.note("clock +%s", d)
			for _, a := range alive {
				for _, s := range a.sessions {
					if !s.stopped.Load() && m.rng.IntN(10) > 0 {
						err := s.write(context.Background())
						m.note("renew %s: %v", s.key, err)
					}
				}
			}
		case r < 203:
			d := modelTimeout/2 + time.Duration(m.rng.IntN(int(modelTimeout/time.Millisecond)))*time.Millisecond
			m.clock.advance(d)
			m.note("pause: clock +%s", d)
		case r < 250:
			var live []*session
			for _, a := range alive {
				for _, s := range a.sessions {
					if !s.stopped.Load() {
						live = append(live, s)
					}
				}
			}
			if len(live) > 0 {
				s := live[m.rng.IntN(len(live))]
				err := s.write(context.Background())
				m.note("renew %s: %v", s.key, err)
			}
		case r < 253:
			if len(alive) > 0 {
				a := alive[m.rng.IntN(len(alive))]
				m.mu.Lock()
				a.killed = true
				isParked := a.state == parked
				if isParked {
					a.state = running
				}
				m.stats.Killed++
				m.mu.Unlock()
				m.note("kill %s", a.name)
				if isParked {
					a.grant <- FailBefore
				}
			}
		default:
			// Prunes move three times as fast as the others.
			var weighted []*actor
			for _, a := range waiting {
				weighted = append(weighted, a)
				if strings.HasPrefix(a.name, "prune") {
					weighted = append(weighted, a, a)
				}
			}
			a := weighted[m.rng.IntN(len(weighted))]
			f := NoFault
			switch r := m.rng.IntN(100); {
			case r < 2:
				f = FailBefore
			case r < 3:
				f = FailAfter
			}
			m.mu.Lock()
			op := a.op
			a.state = running
			m.mu.Unlock()
			m.note("%s: %s%s", a.name, op, map[Fault]string{FailBefore: " (fails)", FailAfter: " (done, then fails)"}[f])
			a.grant <- f
		}
	}
}

// note keeps a step for the log printed on failure (formatted only then).
func (m *model) note(format string, a ...any) {
	m.log = append(m.log, logLine{m.clock.Now(), format, a})
}

type logLine struct {
	at     time.Time
	format string
	args   []any
}

func (m *model) steps() string {
	var b strings.Builder
	for _, l := range m.log[max(0, len(m.log)-modelLogLines):] {
		fmt.Fprintf(&b, "%s %s\n", l.at.Format("04:05.000"), fmt.Sprintf(l.format, l.args...))
	}
	return b.String()
}

// quiet: every actor waits for the scheduler or has ended (m.mu held).
func (m *model) quiet() bool {
	for _, a := range m.actors {
		if a.state == running {
			return false
		}
	}
	return true
}

// check: every manifest's chunks have a copy; so does every chunk a running restore whose
// marker is fresh may read.
func (m *model) check() error {
	// Nothing changed since the last check: the store, and the clock by which markers are
	// fresh.
	changes, now := m.store.Changes(), m.clock.Now()
	if changes == m.checked && now.Equal(m.checkedAt) {
		return nil
	}
	m.checked, m.checkedAt = changes, now
	ctx := context.Background()
	copies := map[string]bool{}
	manifests := map[string]int64{}
	m.store.mu.Lock()
	for k, o := range m.store.objs {
		switch {
		case strings.HasPrefix(k, chunksPrefix):
			copies[strings.Split(k[strings.LastIndexByte(k, '/')+1:], ".")[0]] = true
		case strings.HasPrefix(k, backupsPrefix):
			manifests[k] = o.seq
		}
	}
	m.store.mu.Unlock()
	for k, seq := range manifests {
		raw := fmt.Sprint(k, seq)
		chunks, ok := m.manifests[raw]
		if !ok {
			id := strings.TrimSuffix(strings.TrimPrefix(k, backupsPrefix), manifestSuffix)
			man, err := m.repo.Manifest(ctx, id)
			if err != nil {
				return fmt.Errorf("manifest %s: %w", id, err)
			}
			chunks = man.Chunks
			m.manifests[raw] = chunks
		}
		for _, n := range chunks {
			if n != "" && !copies[n] {
				id := strings.TrimSuffix(strings.TrimPrefix(k, backupsPrefix), manifestSuffix)
				return fmt.Errorf("backup %s lists chunk %s, which has no copy", id, n[:8])
			}
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, a := range m.actors {
		rd := a.reader
		if rd == nil || a.killed || rd.sess.fresh() != nil {
			continue
		}
		for n, keys := range rd.plan {
			if !slices.ContainsFunc(keys, m.store.Has) {
				return fmt.Errorf("%s, its marker fresh, may read chunk %s, of which no planned copy is left (%v)", a.name, n[:8], keys)
			}
		}
	}
	return nil
}
