package backup

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// Fault is what a MemStore's Hook makes of one operation.
type Fault int

const (
	// NoFault: the operation is done.
	NoFault Fault = iota
	// FailBefore: the operation fails without effect (a request that never arrived).
	FailBefore
	// FailAfter: the operation takes effect, then fails (a reply that never came back).
	FailAfter
)

var errInjected = errors.New("injected fault")

// MemStore is a Store in memory whose clock is Now, for tests that move time and fail
// operations: Hook, if set, is called before each operation and says what becomes of it.
// With Deadlines, an operation whose context has a deadline before Now fails without
// effect, as a request whose client gave up does (for clients on the store's clock).
type MemStore struct {
	Now       func() time.Time
	Hook      func(ctx context.Context, op, key string) Fault
	Deadlines bool

	mu     sync.Mutex
	objs   map[string]memObject
	writes int64 // writes and deletions so far
}

type memObject struct {
	data     []byte
	modified time.Time
	seq      int64 // of the write
}

// NewMemStore returns an empty MemStore on the clock now.
func NewMemStore(now func() time.Time) *MemStore {
	return &MemStore{Now: now, objs: map[string]memObject{}}
}

func (m *MemStore) String() string { return "mem://" }

// Keys lists the keys under prefix, in order (no hook).
func (m *MemStore) Keys(prefix string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for k := range m.objs {
		if strings.HasPrefix(k, prefix) {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// Raw is object key's contents (no hook), nil if there is none.
func (m *MemStore) Raw(key string) []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.objs[key].data)
}

// Changes counts the writes and deletions so far.
func (m *MemStore) Changes() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.writes
}

// Has tells whether object key exists (no hook).
func (m *MemStore) Has(key string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.objs[key]
	return ok
}

// Touch writes again, unchanged, every object under prefix (no hook): what a heartbeat does
// to a marker.
func (m *MemStore) Touch(prefix string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for k, o := range m.objs {
		if strings.HasPrefix(k, prefix) {
			m.writes++
			o.modified, o.seq = m.Now(), m.writes
			m.objs[k] = o
			n++
		}
	}
	return n
}

// SetRaw writes object key (no hook).
func (m *MemStore) SetRaw(key string, data []byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.writes++
	m.objs[key] = memObject{data: slices.Clone(data), modified: m.Now(), seq: m.writes}
}

func (m *MemStore) begin(ctx context.Context, op, key string) (Fault, error) {
	f := NoFault
	if m.Hook != nil {
		f = m.Hook(ctx, op, key)
	}
	if err := ctx.Err(); err != nil {
		return f, err
	}
	if d, ok := ctx.Deadline(); ok && m.Deadlines && m.Now().After(d) {
		return f, fmt.Errorf("%s %s: %w", op, key, context.DeadlineExceeded)
	}
	if f == FailBefore {
		return f, fmt.Errorf("%s %s: %w", op, key, errInjected)
	}
	return f, nil
}

func (m *MemStore) end(f Fault, op, key string) error {
	if f == FailAfter {
		return fmt.Errorf("%s %s: %w", op, key, errInjected)
	}
	return nil
}

func (m *MemStore) Put(ctx context.Context, key string, data []byte) error {
	f, err := m.begin(ctx, "put", key)
	if err != nil {
		return err
	}
	m.SetRaw(key, data)
	return m.end(f, "put", key)
}

func (m *MemStore) Create(ctx context.Context, key string, data []byte) error {
	f, err := m.begin(ctx, "create", key)
	if err != nil {
		return err
	}
	m.mu.Lock()
	_, exists := m.objs[key]
	if !exists {
		m.writes++
		m.objs[key] = memObject{data: slices.Clone(data), modified: m.Now(), seq: m.writes}
	}
	m.mu.Unlock()
	if exists {
		return fmt.Errorf("create %s: %w", key, ErrExists)
	}
	return m.end(f, "create", key)
}

func (m *MemStore) Get(ctx context.Context, key string) ([]byte, error) {
	f, err := m.begin(ctx, "get", key)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	o, ok := m.objs[key]
	m.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("get %s: %w", key, ErrNotFound)
	}
	return slices.Clone(o.data), m.end(f, "get", key)
}

func (m *MemStore) Stat(ctx context.Context, key string) (ObjectInfo, error) {
	f, err := m.begin(ctx, "stat", key)
	if err != nil {
		return ObjectInfo{}, err
	}
	m.mu.Lock()
	o, ok := m.objs[key]
	m.mu.Unlock()
	if !ok {
		return ObjectInfo{}, fmt.Errorf("stat %s: %w", key, ErrNotFound)
	}
	return ObjectInfo{Key: key, Size: int64(len(o.data)), Modified: o.modified}, m.end(f, "stat", key)
}

func (m *MemStore) List(ctx context.Context, prefix string, fn func(ObjectInfo) error) error {
	f, err := m.begin(ctx, "list", prefix)
	if err != nil {
		return err
	}
	m.mu.Lock()
	var infos []ObjectInfo
	for k, o := range m.objs {
		if strings.HasPrefix(k, prefix) {
			infos = append(infos, ObjectInfo{Key: k, Size: int64(len(o.data)), Modified: o.modified})
		}
	}
	m.mu.Unlock()
	slices.SortFunc(infos, func(a, b ObjectInfo) int { return strings.Compare(a.Key, b.Key) })
	if f == FailAfter {
		// A listing that breaks half way.
		infos = infos[:len(infos)/2]
	}
	for _, o := range infos {
		if err := fn(o); err != nil {
			return err
		}
	}
	return m.end(f, "list", prefix)
}

func (m *MemStore) Delete(ctx context.Context, key string) error {
	f, err := m.begin(ctx, "delete", key)
	if err != nil {
		return err
	}
	m.mu.Lock()
	delete(m.objs, key)
	m.writes++
	m.mu.Unlock()
	return m.end(f, "delete", key)
}
