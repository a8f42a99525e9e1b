package backup

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/klauspost/compress/zstd"
)

// Both are safe for concurrent use with EncodeAll and DecodeAll.
var (
	encoder, _ = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1))
	decoder, _ = zstd.NewReader(nil, zstd.WithDecoderConcurrency(0), zstd.WithDecoderMaxMemory(2*maxChunk))
)

// chunkKey is where chunk name is stored: under the first two hex digits of the name, so
// that no listing prefix holds more than 1/256 of the chunks.
func chunkKey(name string) string { return chunksPrefix + name[:2] + "/" + name }

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
	return r.keys.seal(buf, encoder.EncodeAll(plain, buf[n:n]), chunkKey(name))
}

// sealedSize is a buffer size that holds any sealed chunk of size bytes: zstd's bound for
// incompressible data, the nonce and the tag.
func sealedSize(size int) int { return size + size/128 + 1024 }

// readChunk reads chunk name back and checks it. A chunk that is missing or damaged is a
// *ChunkError; a store that cannot be read is another error.
func (r *Repository) readChunk(ctx context.Context, name string) ([]byte, error) {
	data, err := r.store.Get(ctx, chunkKey(name))
	if errors.Is(err, ErrNotFound) {
		return nil, &ChunkError{Chunk: name, Err: ErrNotFound}
	}
	if err != nil {
		return nil, fmt.Errorf("chunk %s: %w", name, err)
	}
	packed, err := r.keys.open(data, chunkKey(name))
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
