package backup

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Object keys of a store, under its prefix (docs/backup.md).
const (
	configKey      = "crdipc-backup.json"
	chunksPrefix   = "chunks/"
	backupsPrefix  = "backups/"
	pendingPrefix  = "pending/"
	formatVersion  = 1
	keyCheckLabel  = "crdipc-backup key check"
	keyCheckPlain  = "crdipc backup store"
	defaultChunk   = 4 << 20
	minChunk       = 64 << 10
	maxChunk       = 64 << 20
	manifestSuffix = ".manifest"
)

var (
	// ErrWrongKey: the store was made with another key.
	ErrWrongKey = errors.New("the encryption key is not the store's")
	// ErrNoStore: the bucket (under its prefix) holds no crdipc backup store.
	ErrNoStore = errors.New("no crdipc backup store here")
)

// config is the store's one plaintext object: what a reader needs before it has a key,
// and a check that the key is the right one.
type config struct {
	Format    int    `json:"format"`
	ChunkSize int    `json:"chunkSize"`
	Salt      []byte `json:"salt"`
	// KeyCheck is keyCheckPlain sealed under the store's key: a wrong key is told apart
	// from a damaged object at once, before anything is read or written.
	KeyCheck []byte `json:"keyCheck"`
	// PendingTimeoutSeconds: how long a backup's or restore's marker may go unrenewed before
	// a prune takes it for dead; 600 when absent. Every client of the store must agree on it.
	PendingTimeoutSeconds int `json:"pendingTimeoutSeconds,omitempty"`
}

// Repository is a backup store opened with its key.
type Repository struct {
	store     Store
	keys      *keys
	chunkSize int
	// pendingTimeout is the store's (config.PendingTimeoutSeconds).
	pendingTimeout time.Duration
	// now is the local clock (time.Now; tests move it).
	now func() time.Time
	// sessionHook, if set, is called with each marker's session once it is written (tests).
	sessionHook func(context.Context, *session)
	// manualRenewals: markers are renewed only by the test's calls of session.write.
	manualRenewals bool

	mu        sync.Mutex
	manifests map[string]cachedManifest // by backup ID (Backups)
}

// InitOptions configure a new store.
type InitOptions struct {
	// ChunkSize of the store's backups, a multiple of 4 KiB; default 4 MiB. Fixed once
	// the store exists: chunks of another size would never be shared.
	ChunkSize int
	// PendingTimeout is how long a backup's or restore's marker may go unrenewed before a
	// prune takes it for dead; default (and most) 10 minutes, at least a second. A prune
	// makes at most one epoch per PendingTimeout, so a chunk no backup lists is deleted 1 to
	// 3 of them later. Fixed once the store exists.
	PendingTimeout time.Duration
}

// Open opens the store in s with key, making it first if s holds none. Opening a store
// that exists checks key (ErrWrongKey) and ignores o.
func Open(ctx context.Context, s Store, key []byte, o InitOptions) (*Repository, error) {
	r, err := OpenExisting(ctx, s, key)
	if !errors.Is(err, ErrNoStore) {
		return r, err
	}
	size := o.ChunkSize
	if size == 0 {
		size = defaultChunk
	}
	if size < minChunk || size > maxChunk || size%4096 != 0 {
		return nil, fmt.Errorf("chunk size %d: a multiple of 4 KiB from %d to %d is needed", size, minChunk, maxChunk)
	}
	pt := o.PendingTimeout
	if pt == 0 {
		pt = defaultPendingTimeout
	}
	if pt < time.Second || pt > defaultPendingTimeout || pt%time.Second != 0 {
		return nil, fmt.Errorf("pending timeout %s: whole seconds from 1s to %s are needed", pt, defaultPendingTimeout)
	}
	cfg := config{Format: formatVersion, ChunkSize: size, Salt: make([]byte, 32), PendingTimeoutSeconds: int(pt / time.Second)}
	if _, err := rand.Read(cfg.Salt); err != nil {
		return nil, err
	}
	k, err := deriveKeys(key, cfg.Salt)
	if err != nil {
		return nil, fmt.Errorf("store %s: %w", s, err)
	}
	cfg.KeyCheck = k.seal(nil, []byte(keyCheckPlain), keyCheckLabel)
	data, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	// Written only if absent: of two clients making the store at once, one writes its
	// salt and the other opens the store with it.
	if err := s.Create(ctx, configKey, data); err != nil && !errors.Is(err, ErrExists) {
		return nil, fmt.Errorf("store %s: writing its configuration: %w", s, err)
	}
	return OpenExisting(ctx, s, key)
}

// OpenExisting opens the store in s with key: ErrNoStore if there is none, ErrWrongKey if
// key is not its key.
func OpenExisting(ctx context.Context, s Store, key []byte) (*Repository, error) {
	data, err := s.Get(ctx, configKey)
	if errors.Is(err, ErrNotFound) {
		return nil, fmt.Errorf("store %s: %w", s, ErrNoStore)
	}
	if err != nil {
		return nil, fmt.Errorf("store %s: reading its configuration: %w", s, err)
	}
	var cfg config
	if err := json.Unmarshal(data, &cfg); err != nil {
		return nil, fmt.Errorf("store %s: its configuration %s is damaged: %w", s, configKey, err)
	}
	if cfg.Format != formatVersion {
		return nil, fmt.Errorf("store %s: format %d, this version reads format %d", s, cfg.Format, formatVersion)
	}
	if cfg.ChunkSize < minChunk || cfg.ChunkSize > maxChunk || cfg.ChunkSize%4096 != 0 {
		return nil, fmt.Errorf("store %s: its configuration gives chunk size %d, which is not one this version writes", s, cfg.ChunkSize)
	}
	k, err := deriveKeys(key, cfg.Salt)
	if err != nil {
		return nil, fmt.Errorf("store %s: %w", s, err)
	}
	if plain, err := k.open(cfg.KeyCheck, keyCheckLabel); err != nil || string(plain) != keyCheckPlain {
		return nil, fmt.Errorf("store %s: %w", s, ErrWrongKey)
	}
	pt := defaultPendingTimeout
	if cfg.PendingTimeoutSeconds > 0 {
		pt = time.Duration(cfg.PendingTimeoutSeconds) * time.Second
	}
	return &Repository{store: s, keys: k, chunkSize: cfg.ChunkSize, pendingTimeout: pt, now: time.Now, manifests: map[string]cachedManifest{}}, nil
}

// ChunkSize is the store's chunk size in bytes.
func (r *Repository) ChunkSize() int { return r.chunkSize }

// Store is where the repository keeps its objects.
func (r *Repository) Store() Store { return r.store }
