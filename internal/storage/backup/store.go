package backup

import (
	"context"
	"errors"
	"time"
)

var (
	// ErrNotFound: no object of that key.
	ErrNotFound = errors.New("object not found")
	// ErrExists: Create found an object of that key.
	ErrExists = errors.New("object exists")
)

// ObjectInfo is what a Store says of an object.
type ObjectInfo struct {
	Key  string
	Size int64
	// Modified is when the store last wrote the object, by the store's clock.
	Modified time.Time
}

// Store is an object store: S3 (NewS3), or another that keeps whole objects by key. Keys
// are relative to the store's prefix. Every method is safe for concurrent use.
type Store interface {
	// Put writes the object key, replacing one that exists.
	Put(ctx context.Context, key string, data []byte) error
	// Create writes the object key unless one exists (ErrExists): S3's conditional write,
	// If-None-Match: *. A service that ignores the condition replaces the object.
	Create(ctx context.Context, key string, data []byte) error
	// Get reads object key whole; ErrNotFound if there is none.
	Get(ctx context.Context, key string) ([]byte, error)
	// Stat describes object key; ErrNotFound if there is none.
	Stat(ctx context.Context, key string) (ObjectInfo, error)
	// List calls fn for every object whose key starts with prefix, in key order.
	List(ctx context.Context, prefix string, fn func(ObjectInfo) error) error
	// Delete removes object key; deleting one that is not there is no error.
	Delete(ctx context.Context, key string) error
	// String names the store in errors: endpoint, bucket and prefix.
	String() string
}
