package backend

import (
	"context"
	"errors"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
)

// ErrNotFound is returned (wrapped) by ImportPool and StatReplica when the pool or replica
// does not exist on the node.
var ErrNotFound = errors.New("not found")

// ErrNoSpace is returned (wrapped) by GrowReplica when the pool has no room for the growth.
var ErrNoSpace = errors.New("not enough space in the pool")

// Pool identifies a pool and how it should be made.
type Pool struct {
	Name     string
	Type     storagev1alpha1.PoolType
	Capacity int64 // bytes
}

// Replica identifies a replica within a pool.
type Replica struct {
	Namespace, Name string
	Capacity        int64 // bytes
}

// PoolState is a pool as found on the node.
type PoolState struct {
	// Location is where the pool lives: a directory, a zpool name.
	Location string
	// Total, Used and Free are in bytes. Used counts the replicas' logical sizes, since
	// replicas are thin and their space is promised even before it is written.
	Total, Used, Free int64
	// Degraded: the pool serves I/O with reduced redundancy (a zpool's DEGRADED health).
	Degraded bool
	// Full: the file system under the pool has (almost) no space left, whatever its
	// replicas were promised: writes to thin replicas fail with ENOSPC.
	Full bool
}

// ReplicaState is a replica as found on the node.
type ReplicaState struct {
	// Location is where the replica lives: a file, a zvol.
	Location string
	// Size is the logical size; Allocated the space actually used on disk.
	Size, Allocated int64
}

// Backend creates, finds and destroys pools and replicas on one node.
type Backend interface {
	// CreatePool creates the pool or, if it exists, adopts it.
	CreatePool(ctx context.Context, p Pool) (PoolState, error)
	// ImportPool finds an existing pool; ErrNotFound if it is gone. It never creates one.
	ImportPool(ctx context.Context, p Pool) (PoolState, error)
	// DeletePool destroys the pool and its data; a missing pool is success.
	DeletePool(ctx context.Context, p Pool) error
	// CreateReplica creates the replica in an existing pool or, if it exists, adopts it
	// (growing it first if it is smaller than r.Capacity: a growth interrupted before the
	// replica was recorded).
	CreateReplica(ctx context.Context, p Pool, r Replica) (ReplicaState, error)
	// StatReplica finds an existing replica; ErrNotFound if it is gone.
	StatReplica(ctx context.Context, p Pool, r Replica) (ReplicaState, error)
	// GrowReplica grows an existing replica to r.Capacity (rounded as CreateReplica rounds);
	// one that already holds as much is left as it is, so it never shrinks and may be called
	// again after a crash. ErrNotFound if the replica is gone, ErrNoSpace if the pool cannot
	// hold the growth.
	GrowReplica(ctx context.Context, p Pool, r Replica) (ReplicaState, error)
	// DeleteReplica destroys the replica's data; a missing replica is success.
	DeleteReplica(ctx context.Context, p Pool, r Replica) error
}
