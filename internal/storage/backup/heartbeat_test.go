package backup

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/crdipc/crdipc/internal/testenv/wait"
)

// A backup whose marker could not be renewed for longer than a prune waits for a silent
// backup, and then could again, fails rather than write its manifest: a prune may have
// taken it for dead meanwhile and deleted a chunk it reuses. Its last renewal is recent; the
// gap is what counts. (Before, only the last renewal was checked.) The clock is the test's:
// the store's and the backup's, moved on while the marker's writes fail.
func TestBackupWhoseMarkerLapsedFails(t *testing.T) {
	ctx := t.Context()
	clock := &fakeClock{t: time.Now()}
	store := NewMemStore(clock.Now)
	repo, err := Open(ctx, store, bytes.Repeat([]byte{1}, 32), InitOptions{ChunkSize: minChunk})
	if err != nil {
		t.Fatal(err)
	}
	repo.now = clock.Now
	var lost atomic.Bool
	store.Hook = func(_ context.Context, op, key string) Fault {
		if lost.Load() && op == "put" && strings.HasPrefix(key, pendingPrefix) {
			return FailBefore
		}
		return NoFault
	}
	v := make([]byte, 4*minChunk)
	_, _ = rand.Read(v)
	src := &pausedVolume{r: bytes.NewReader(v), at: minChunk, reached: make(chan struct{}), release: make(chan struct{})}
	done := make(chan error, 1)
	go func() {
		_, err := repo.Backup(ctx, src, int64(len(v)), BackupOptions{ID: "paused", Volume: "ns/data", Concurrency: 1, Heartbeat: time.Millisecond})
		done <- err
	}()
	<-src.reached

	// The marker goes unrenewed for 6 minutes (S3 unreachable, or the node frozen), more
	// than half the pending timeout, then is renewed again.
	lost.Store(true)
	renewed := func() time.Time {
		keys := store.Keys(pendingPrefix)
		if len(keys) != 1 {
			t.Fatalf("markers %v, want the backup's", keys)
		}
		o, err := store.Stat(ctx, keys[0])
		if err != nil {
			t.Fatal(err)
		}
		return o.Modified
	}
	before := renewed()
	clock.advance(6 * time.Minute)
	lost.Store(false)
	wait.Eventually(t, 10*time.Second, "the marker renewed after the gap", func(context.Context) (bool, error) {
		return renewed().After(before), nil
	})
	close(src.release)
	err = <-done
	if err == nil || !strings.Contains(err.Error(), "without renewal") {
		t.Fatalf("a backup whose marker lapsed for 6 minutes: %v; want it failed", err)
	}
	t.Logf("refused: %v", err)
	if _, err := repo.Manifest(ctx, "paused"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the backup whose marker lapsed wrote its manifest: %v", err)
	}
}

// pausedVolume is a volume whose reads at or past at wait until release, after saying so.
type pausedVolume struct {
	r       *bytes.Reader
	at      int64
	once    sync.Once
	reached chan struct{}
	release chan struct{}
}

func (g *pausedVolume) ReadAt(p []byte, off int64) (int, error) {
	if off >= g.at {
		g.once.Do(func() { close(g.reached) })
		<-g.release
	}
	return g.r.ReadAt(p, off)
}

// stop waits for a renewal of the marker under way rather than cancel it: an S3 server may
// still store a PUT its client gave up on, after stop's DELETE, and the marker would then
// hold every prune back for a pending timeout (seen in CI: a finished backup still listed
// as running). The store's hook holds one renewal until the test lets it go, and reports it
// if its client gives up first.
func TestStopWaitsForARenewalUnderWay(t *testing.T) {
	ctx := t.Context()
	store := NewMemStore(time.Now)
	repo, err := Open(ctx, store, bytes.Repeat([]byte{1}, 32), InitOptions{ChunkSize: minChunk})
	if err != nil {
		t.Fatal(err)
	}
	var armed atomic.Bool
	var once sync.Once
	held, release, abandoned := make(chan struct{}), make(chan struct{}), make(chan struct{})
	store.Hook = func(ctx context.Context, op, key string) Fault {
		if op != "put" || !strings.HasPrefix(key, pendingPrefix) || !armed.Load() {
			return NoFault
		}
		first := false
		once.Do(func() { first = true; close(held) })
		if !first {
			return NoFault
		}
		select {
		case <-release:
		case <-ctx.Done():
			close(abandoned)
		}
		return NoFault
	}
	s, err := repo.openSession(ctx, pendingPrefix+"b/"+randomID(), "b", time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	armed.Store(true)
	<-held
	stopped := make(chan struct{})
	go func() { s.stop(ctx); close(stopped) }()
	wait.Eventually(t, 10*time.Second, "stop called", func(context.Context) (bool, error) { return s.stopped.Load(), nil })
	select {
	case <-abandoned:
		t.Fatal("stop cancelled the marker's renewal under way; on S3 it may land after the marker's removal")
	default:
	}
	close(release)
	<-stopped
	if keys := store.Keys(pendingPrefix); len(keys) != 0 {
		t.Fatalf("markers left after stop: %v", keys)
	}
}
