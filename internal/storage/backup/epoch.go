package backup

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// An epoch is what one prune decided (docs/backup.md, "Backing up while a prune runs"). Epoch
// n is the object prune/epochs/<n>, written once (a conditional write: of two prunes only one
// makes it) and never changed. It names the chunk copies (object keys) that it condemns, to be
// deleted by the prune that makes epoch n+1, and those that its own prune deletes. A backup or
// restore reads the newest epoch when it starts and writes its number into its marker; a
// backup that read epoch n neither reuses a copy that epoch n condemns or deletes nor writes
// any copy but its own, chunks/…/<name>.<n>: a copy that existed before epoch n was made.
type epoch struct {
	Seq       int64    `json:"seq"`
	Condemned []string `json:"condemned,omitempty"`
	Deleting  []string `json:"deleting,omitempty"`
	// created is the object's time by the store's clock (not stored in it).
	created time.Time
}

const epochsPrefix = "prune/epochs/"

func epochKey(seq int64) string { return fmt.Sprintf("%s%020d", epochsPrefix, seq) }

// avoided: the copies that a backup that read e must not reuse.
func (e *epoch) avoided() map[string]bool {
	out := make(map[string]bool, len(e.Condemned)+len(e.Deleting))
	for _, k := range e.Condemned {
		out[k] = true
	}
	for _, k := range e.Deleting {
		out[k] = true
	}
	return out
}

// latestSeq lists the epochs: the newest one's number and store time (0 if there is none).
func (r *Repository) latestSeq(ctx context.Context) (int64, time.Time, error) {
	var (
		seq     int64
		created time.Time
	)
	err := r.store.List(ctx, epochsPrefix, func(o ObjectInfo) error {
		n, err := strconv.ParseInt(strings.TrimPrefix(o.Key, epochsPrefix), 10, 64)
		if err == nil && n > seq {
			seq, created = n, o.Modified
		}
		return nil
	})
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("listing the prune epochs of %s: %w", r.store, err)
	}
	return seq, created, nil
}

// latestEpoch reads the newest epoch; an empty epoch 0 if no prune made one yet.
func (r *Repository) latestEpoch(ctx context.Context) (*epoch, error) {
	for range 3 {
		seq, created, err := r.latestSeq(ctx)
		if err != nil || seq == 0 {
			return &epoch{}, err
		}
		data, err := r.store.Get(ctx, epochKey(seq))
		if errors.Is(err, ErrNotFound) {
			continue // removed as old meanwhile: a newer one exists
		}
		if err != nil {
			return nil, fmt.Errorf("reading %s in %s: %w", epochKey(seq), r.store, err)
		}
		e := &epoch{}
		if err := json.Unmarshal(data, e); err != nil || e.Seq != seq {
			return nil, fmt.Errorf("%s in %s is damaged: %v", epochKey(seq), r.store, err)
		}
		e.created = created
		return e, nil
	}
	return nil, fmt.Errorf("the prune epochs of %s keep changing", r.store)
}

// marker is a running backup's (pending/<id>/<random>) or restore's (restoring/<random>)
// object.
type marker struct {
	ID      string    `json:"id"`
	Started time.Time `json:"started"`
	// Epoch is the epoch it read; -1 in markers of versions that wrote none.
	Epoch int64 `json:"epoch"`
}

const restoringPrefix = "restoring/"

// session is a running backup's or restore's marker, renewed every so often. It records the
// longest time its marker went without renewal: past half the pending timeout a prune may
// have taken it for dead.
type session struct {
	r      *Repository
	key    string
	m      marker
	ep     *epoch
	cancel context.CancelFunc
	done   chan struct{}

	stopped atomic.Bool

	mu        sync.Mutex
	lastStart time.Time     // when the last successful write of the marker began (r.now)
	worst     time.Duration // the longest time from the start of one write to the end of the next
	lastErr   error
}

// openSession writes the marker key, with the number of the newest epoch, and checks that no
// newer one was made meanwhile (else it writes the newer number and checks again): a prune
// that makes an epoch after this returns lists the marker, and one that made it before was
// read. every is how often the marker is renewed.
func (r *Repository) openSession(ctx context.Context, key, id string, every time.Duration) (*session, error) {
	s := &session{r: r, key: key, m: marker{ID: id, Started: r.now().UTC()}, done: make(chan struct{})}
	ep, err := r.latestEpoch(ctx)
	if err != nil {
		return nil, err
	}
	for i := 0; ; i++ {
		s.m.Epoch = ep.Seq
		if err := s.write(ctx); err != nil {
			s.remove(ctx) // a write that failed may have been done
			return nil, fmt.Errorf("writing %s to %s: %w", key, r.store, err)
		}
		seq, _, err := r.latestSeq(ctx)
		if err == nil && seq == ep.Seq {
			break
		}
		if err == nil && i < 5 {
			ep, err = r.latestEpoch(ctx)
		} else if err == nil {
			err = errors.New("prunes keep making epochs")
		}
		if err != nil {
			s.remove(ctx)
			return nil, err
		}
	}
	s.ep = ep
	if r.sessionHook != nil {
		r.sessionHook(ctx, s)
	}
	hctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.cancel = cancel
	if r.manualRenewals {
		close(s.done)
		return s, nil
	}
	go func() {
		defer close(s.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-hctx.Done():
				return
			case <-t.C:
			}
			// stop does not cancel a renewal under way, it waits for it: an S3 server may
			// still store a PUT whose client gave up, after stop's DELETE of the marker,
			// which would then hold prunes back for a whole pending timeout.
			wctx, cancel := context.WithTimeout(context.WithoutCancel(hctx), storeOpTimeout)
			_ = s.write(wctx)
			cancel()
		}
	}()
	return s, nil
}

// write writes the marker once and keeps the longest gap.
func (s *session) write(ctx context.Context) error {
	// The marker changes under s.mu (a restore claims an older epoch) while the renewal
	// goroutine writes it.
	s.mu.Lock()
	data, _ := json.Marshal(s.m)
	s.mu.Unlock()
	start := s.r.now()
	err := s.r.store.Put(ctx, s.key, data)
	end := s.r.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil {
		if !s.lastStart.IsZero() {
			s.worst = max(s.worst, end.Sub(s.lastStart))
		}
		s.lastStart = start
	}
	s.lastErr = err
	return err
}

// fresh fails if the marker ever went without renewal for half the pending timeout: a prune
// that found it older than the whole timeout took this for dead and may have deleted what it
// reuses. A gap that ended (the marker renewed again since) counts as much as one that lasts.
func (s *session) fresh() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	gap := max(s.worst, s.r.now().Sub(s.lastStart))
	if limit := s.r.pendingTimeout / 2; gap > limit {
		msg := fmt.Sprintf("its marker in %s once went %s without renewal, more than %s: a prune may have taken it for dead", s.r.store, gap.Round(time.Millisecond), limit)
		if s.lastErr != nil {
			msg += fmt.Sprintf(" (last error: %v)", s.lastErr)
		}
		return errors.New(msg)
	}
	return nil
}

// storeOpTimeout bounds a marker's renewal and its removal, which stop waits for.
const storeOpTimeout = 30 * time.Second

// stop ends the renewals, once the one under way (if any) is done, and removes the marker.
func (s *session) stop(ctx context.Context) {
	s.stopped.Store(true)
	s.cancel()
	<-s.done
	s.remove(ctx)
}

func (s *session) remove(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storeOpTimeout)
	defer cancel()
	_ = s.r.store.Delete(ctx, s.key) // a marker left behind only delays prunes (the pending timeout)
}

func randomID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// storeClock is the store's time now, read from an object written now.
func (r *Repository) storeClock(ctx context.Context) (time.Time, error) {
	const clockKey = "prune/clock"
	if err := r.store.Put(ctx, clockKey, nil); err != nil {
		return time.Time{}, fmt.Errorf("reading the clock of %s: %w", r.store, err)
	}
	clock, err := r.store.Stat(ctx, clockKey)
	if err != nil {
		return time.Time{}, fmt.Errorf("reading the clock of %s: %w", r.store, err)
	}
	return clock.Modified, nil
}

// liveMarkers lists the markers under prefix renewed within the pending timeout, by the
// store's clock.
func (r *Repository) liveMarkers(ctx context.Context, prefix string) ([]marker, error) {
	now, err := r.storeClock(ctx)
	if err != nil {
		return nil, err
	}
	var keys []string
	err = r.store.List(ctx, prefix, func(o ObjectInfo) error {
		if now.Sub(o.Modified) <= r.pendingTimeout {
			keys = append(keys, o.Key)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing the running backups and restores of %s: %w", r.store, err)
	}
	var out []marker
	for _, k := range keys {
		// Older versions wrote pending/<id>, with no epoch.
		m := marker{ID: strings.Split(strings.TrimPrefix(k, prefix), "/")[0], Epoch: -1}
		data, err := r.store.Get(ctx, k)
		if errors.Is(err, ErrNotFound) {
			continue // ended since the listing
		}
		if err != nil {
			return nil, fmt.Errorf("reading %s in %s: %w", k, r.store, err)
		}
		// A marker that does not read as one is taken as one of the oldest epoch.
		_ = json.Unmarshal(data, &m)
		out = append(out, m)
	}
	return out, nil
}
