package backup

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"

	"github.com/klauspost/compress/zstd"
)

// Both are safe for concurrent use with EncodeAll and DecodeAll. EncodeAll takes one of
// the encoder's states for its call: as many as the backup's workers can use, or they
// compress one at a time.
var (
	encoder, _ = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(runtime.GOMAXPROCS(0)))
	decoder, _ = zstd.NewReader(nil, zstd.WithDecoderConcurrency(0), zstd.WithDecoderMaxMemory(2*maxChunk))
)

// chunkKey is where the copy of chunk name written in epoch gen is stored: under the first
// two hex digits of the name, so that no listing prefix holds more than 1/256 of the chunks,
// and with the epoch after a dot (none for epoch 0). A chunk may have several copies; any of
// them that reads back will do.
func chunkKey(name string, gen int64) string {
	if gen == 0 {
		return chunksPrefix + name[:2] + "/" + name
	}
	return chunksPrefix + name[:2] + "/" + name + "." + strconv.FormatInt(gen, 10)
}

// chunkLabel binds a chunk's ciphertext to its name (whichever copy).
func chunkLabel(name string) string { return chunkKey(name, 0) }

// chunkCopy is one stored copy of a chunk.
type chunkCopy struct {
	Name string
	Gen  int64
	Info ObjectInfo
}

// parseChunkKey reads a copy's name and epoch from its key.
func parseChunkKey(o ObjectInfo) (chunkCopy, bool) {
	base := o.Key[strings.LastIndexByte(o.Key, '/')+1:]
	name, gen, dotted := strings.Cut(base, ".")
	c := chunkCopy{Name: name, Info: o}
	if dotted {
		n, err := strconv.ParseInt(gen, 10, 64)
		if err != nil || n <= 0 {
			return c, false
		}
		c.Gen = n
	}
	return c, len(name) == 64
}

// damagedPrefix holds an empty object per chunk copy found damaged (its key under chunks/):
// a backup does not reuse such a copy but writes its own, and a restore reads another.
const damagedPrefix = "damaged/"

func damagedKey(key string) string { return damagedPrefix + strings.TrimPrefix(key, chunksPrefix) }

// chunkList is what the store holds of chunks: every copy by key, and the copies found
// damaged.
type chunkList struct {
	copies  map[string]chunkCopy
	damaged map[string]bool
}

// byName groups the copies by chunk name.
func (l *chunkList) byName() map[string][]chunkCopy {
	out := make(map[string][]chunkCopy, len(l.copies))
	for _, c := range l.copies {
		out[c.Name] = append(out[c.Name], c)
	}
	return out
}

// storedChunks lists the stored chunk copies (a thousand names a request) and the damaged
// ones.
func (r *Repository) storedChunks(ctx context.Context) (*chunkList, error) {
	l := &chunkList{copies: map[string]chunkCopy{}, damaged: map[string]bool{}}
	err := r.store.List(ctx, chunksPrefix, func(o ObjectInfo) error {
		if c, ok := parseChunkKey(o); ok {
			l.copies[o.Key] = c
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing the chunks in %s: %w", r.store, err)
	}
	err = r.store.List(ctx, damagedPrefix, func(o ObjectInfo) error {
		l.damaged[chunksPrefix+strings.TrimPrefix(o.Key, damagedPrefix)] = true
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing the damaged chunks in %s: %w", r.store, err)
	}
	return l, nil
}

// markDamaged records that copy key does not read back, so that no backup reuses it.
func (r *Repository) markDamaged(ctx context.Context, key string) error {
	if err := r.store.Put(ctx, damagedKey(key), nil); err != nil {
		return fmt.Errorf("recording that %s is damaged in %s: %w", key, r.store, err)
	}
	return nil
}

// ChunkError is a chunk that is missing or does not read back as what its name says.
type ChunkError struct {
	Chunk string
	// Backups are the backups that list it (those a restore of would fail), when known.
	Backups []string
	Err     error
}

func (e *ChunkError) Error() string {
	msg := fmt.Sprintf("chunk %s: %v", e.Chunk, e.Err)
	if len(e.Backups) > 0 {
		msg += "; it breaks backup " + strings.Join(e.Backups, ", ")
	}
	return msg
}

func (e *ChunkError) Unwrap() error { return e.Err }

// errAltered: a chunk decrypted, but its contents are not what its name says.
var errAltered = errors.New("its contents do not match its name")

// sealChunk compresses and encrypts plain, bound to its name, into buf if it is large
// enough (sealedSize): compressed past the nonce's room and sealed there, no copy is made.
func (r *Repository) sealChunk(plain []byte, name string, buf []byte) []byte {
	n := r.keys.aead.NonceSize()
	if cap(buf) < n {
		buf = make([]byte, n, sealedSize(len(plain)))
	}
	return r.keys.seal(buf, encoder.EncodeAll(plain, buf[n:n]), chunkLabel(name))
}

// sealedSize is a buffer size that holds any sealed chunk of size bytes: zstd's bound for
// incompressible data, the nonce and the tag.
func sealedSize(size int) int { return size + size/128 + 1024 }

// readChunk reads chunk name back from the first of its copies (keys) that reads back, and
// records each that is damaged (best effort: the next backup holding its contents then writes
// a good copy). No copy that reads back is a *ChunkError, of the last copy's problem; a store
// that cannot be read is another error.
func (r *Repository) readChunk(ctx context.Context, name string, keys []string) ([]byte, error) {
	err := error(&ChunkError{Chunk: name, Err: ErrNotFound})
	for _, key := range keys {
		var plain []byte
		plain, err = r.readCopy(ctx, name, key)
		var ce *ChunkError
		if errors.As(err, &ce) && !errors.Is(err, ErrNotFound) {
			_ = r.markDamaged(ctx, key)
		}
		if err == nil || !errors.As(err, &ce) {
			return plain, err
		}
	}
	return nil, err
}

// readCopy reads copy key of chunk name and checks it.
func (r *Repository) readCopy(ctx context.Context, name, key string) ([]byte, error) {
	data, err := r.store.Get(ctx, key)
	if errors.Is(err, ErrNotFound) {
		return nil, &ChunkError{Chunk: name, Err: ErrNotFound}
	}
	if err != nil {
		return nil, fmt.Errorf("chunk %s: %w", name, err)
	}
	packed, err := r.keys.open(data, chunkLabel(name))
	if err != nil {
		return nil, &ChunkError{Chunk: name, Err: err}
	}
	plain, err := decoder.DecodeAll(packed, make([]byte, 0, r.chunkSize))
	if err != nil {
		return nil, &ChunkError{Chunk: name, Err: fmt.Errorf("decompressing: %w", err)}
	}
	if r.keys.name(plain) != name {
		return nil, &ChunkError{Chunk: name, Err: errAltered}
	}
	return plain, nil
}
