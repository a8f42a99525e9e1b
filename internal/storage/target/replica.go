package target

import (
	"context"
	"crypto/tls"
	"fmt"
	"sync/atomic"

	"github.com/crdipc/crdipc/internal/storage/replica"
)

// Info is a replica's state as its server reports it.
type Info = replica.Info

// Replica is one replica as the engine uses it: the client methods of the replica data
// service. *replica.Client satisfies it; unit tests use an in-memory fake.
type Replica interface {
	ID() string
	Info(ctx context.Context) (Info, error)
	// Open starts the writer session (exclusive per replica; marks it Dirty durably).
	Open(ctx context.Context) (Info, error)
	// WriteAt applies p at off inside the writer session; Revision = max(Revision, rev).
	WriteAt(ctx context.Context, p []byte, off int64, rev uint64) error
	// ReadAt fills p completely or fails.
	ReadAt(ctx context.Context, p []byte, off int64) error
	Flush(ctx context.Context) error
	// CloseSession flushes, clears Dirty durably and ends the writer session.
	CloseSession(ctx context.Context) error
	// Rebuild makes the replica copy itself from the replica sourceID served at sourceAddr
	// in the background; it returns once the rebuild has begun (writes from then on are kept).
	Rebuild(ctx context.Context, sourceAddr, sourceID string) error
	// Snapshot copies the replica's data as of the call to snapshot name, within the writer
	// session; a complete one of that name is reported as it is (Created false).
	Snapshot(ctx context.Context, name string) (replica.SnapshotInfo, error)
	// DeleteSnapshot deletes snapshot name; a missing one is success. No session needed.
	DeleteSnapshot(ctx context.Context, name string) error
}

// Member is a replica of the volume as placed by the control plane.
type Member struct {
	// ID is the replica's id (namespace/name) as its replica server knows it.
	ID string
	// Addr is the address of the replica server holding it; other replicas pull from it
	// when they are rebuilt from this one.
	Addr string
	// Local marks the replica on the target's own node: reads prefer it.
	Local bool
	// Replica is the handle to use. It may be nil when Dial is set.
	Replica Replica
	// Dial, when set, opens a new handle; the engine calls it to reconnect a faulted
	// replica. When Dial is set the engine owns every handle of this member and closes
	// those that implement io.Closer; otherwise the caller owns Replica.
	Dial func(ctx context.Context) (Replica, error)
}

// remote is a replica reached through its own connection, so closing it (when the engine
// gives up on it) ends its writer session on the server.
type remote struct {
	*replica.Client
	conn *replica.Conn
}

var _ Replica = remote{}

func (r remote) Close() error { return r.conn.Close() }

// RemoteMember is a Member for replica id on the replica server at addr, reached over mutual
// TLS with tlsConf (replica.ClientTLSConfig). Each (re)connection is a fresh replica.Conn
// owned by the engine.
func RemoteMember(id, addr string, tlsConf *tls.Config, local bool) Member {
	return Member{ID: id, Addr: addr, Local: local, Dial: func(ctx context.Context) (Replica, error) {
		conn, err := replica.Dial(ctx, addr, tlsConf)
		if err != nil {
			return nil, fmt.Errorf("replica %s at %s: %w", id, addr, err)
		}
		return remote{Client: conn.Replica(id), conn: conn}, nil
	}}
}

// LocalLink is how a target reaches the replica server of its own node without TLS: the
// server's local socket (replica.ServerOptions.LocalSocket) and the node's name.
type LocalLink struct {
	// Socket is the path of the node's local replica socket.
	Socket string
	// Node is the target's node: a socket that answers for another is not used.
	Node string
	// Dialed, when set, is told of each connection LocalMember opens: over the socket
	// (localErr nil), or over TLS because the socket could not be used (localErr why).
	Dialed func(localErr error)
	// Reading, when set, is told at each writer session opened over the socket whether the
	// replica is read through a descriptor of its file (fileErr nil) or over the socket
	// (fileErr why).
	Reading func(fileErr error)
	// ReadOverSocket keeps reads on the socket, as a server that cannot hand out the file
	// would: benchmarks compare the two.
	ReadOverSocket bool
}

// LocalMember is RemoteMember for the replica on the target's own node (Local is true):
// each (re)connection goes over the node's local socket, and over TLS to addr only when
// the socket cannot be used (an agent that serves none, or one not yet listening). Both
// reach the same server, which serves the replica alike on either; the socket saves TLS's
// cipher and loopback TCP on every request (replica.BenchmarkRead1MiB). Once its writer
// session is open over the socket the replica is read through a read-only descriptor of its
// file (replica.OpenLocalFile), one pread instead of a request and a reply, and written
// through the server as before.
func LocalMember(id, addr string, tlsConf *tls.Config, link LocalLink) Member {
	m := RemoteMember(id, addr, tlsConf, true)
	overTLS := m.Dial
	m.Dial = func(ctx context.Context) (Replica, error) {
		conn, lerr := replica.DialLocal(ctx, link.Socket, link.Node)
		if lerr == nil {
			if link.Dialed != nil {
				link.Dialed(nil)
			}
			r := remote{Client: conn.Replica(id), conn: conn}
			if link.ReadOverSocket {
				return r, nil
			}
			return &fileReader{remote: r, link: link}, nil
		}
		r, err := overTLS(ctx)
		if err != nil {
			return nil, fmt.Errorf("%w (and over the local socket: %w)", err, lerr)
		}
		if link.Dialed != nil {
			link.Dialed(lerr)
		}
		return r, nil
	}
	return m
}

// fileReader is the local replica read through a read-only descriptor of its data file
// once its writer session is open, and written, like every other, through its server.
//
// The descriptor is asked for after Open: while this connection's session holds the
// replica, the server hands out the file that session writes (the same replica object),
// even if the replica's name was deleted and made again meanwhile. The engine reads the
// replica only while it is healthy in that session, so every write acknowledged before a
// read was applied to the file's page cache, which the descriptor shares (a large aligned
// read bypasses it, after the kernel writes back its range: replicaFile). A pread takes no
// deadline: a stuck local disk stalls it, as it would stall the server's.
type fileReader struct {
	remote
	link LocalLink
	f    atomic.Pointer[replicaFile]
}

var _ Replica = (*fileReader)(nil)

func (r *fileReader) Open(ctx context.Context) (Info, error) {
	in, err := r.remote.Open(ctx)
	if err != nil || r.f.Load() != nil {
		return in, err
	}
	// A server without opFile leaves reads on the socket.
	f, ferr := replica.OpenLocalFile(ctx, r.link.Socket, r.link.Node, r.ID())
	if r.link.Reading != nil {
		r.link.Reading(ferr)
	}
	if ferr == nil {
		if rf := newReplicaFile(f); !r.f.CompareAndSwap(nil, rf) {
			rf.Close()
		}
	}
	return in, nil
}

func (r *fileReader) ReadAt(ctx context.Context, p []byte, off int64) error {
	f := r.f.Load()
	if f == nil {
		return r.remote.ReadAt(ctx, p, off)
	}
	if err := f.ReadAt(p, off); err != nil {
		return fmt.Errorf("replica %s: %w", r.ID(), err)
	}
	return nil
}

func (r *fileReader) Close() error {
	if f := r.f.Swap(nil); f != nil {
		f.Close()
	}
	return r.remote.Close()
}
