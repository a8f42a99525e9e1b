// Package replica is one node's replica data service: a Server that serves the node's
// sparse replica files to authenticated peers, and the Client the volume target (and other
// servers, when rebuilding) use to write, read, flush and rebuild them.
//
// # Transport
//
// TLS 1.3 over TCP with mutual authentication: the server requires and verifies a client
// certificate against the CA it is given, and clients verify the server against the same CA
// (ServerTLSConfig, ClientTLSConfig; NewCA and CA.Issue make the certificates, valid for both
// roles). The ALPN protocol "crdipc-replica/1" versions the wire format. Dial does one round
// trip before returning, because in TLS 1.3 a refused client certificate only shows after
// the client's side of the handshake has completed.
//
// # Framing
//
// One connection carries many requests at once. Every frame starts with a big-endian u32,
// the number of bytes that follow. A request continues with
//
//	u64 request id | u8 op | u8 flags (0) | u16 id length | i64 offset | u64 arg | replica id | payload
//
// and a response with
//
//	u64 request id | u8 status | 3 zero bytes | u64 arg | payload
//
// Responses carry the id of their request and may come in any order: the server runs the
// requests of a connection concurrently (at most 64 at a time; beyond that it stops
// reading) and one goroutine per side writes frames through a buffer, flushing when its
// queue is empty. arg is the revision of a write and the length of a read or of an extents
// query. Payloads are the data of a write or read, JSON Info for Info and Open, u64
// (offset, length) pairs for Extents (arg 1 in the response: more follow), the source of a
// Rebuild (u16-prefixed address and id), the snapshot name of Snapshot and DeleteSnapshot
// (JSON SnapshotInfo in Snapshot's response), or the error message when status is not 0. Status
// codes map to ErrBusy, ErrNotFound, ErrNoSession, ErrTooLarge and ErrInvalid, so errors.Is
// works on the client side (RemoteError). A payload over MaxPayload (4 MiB) is skipped and
// refused with ErrTooLarge, leaving the connection usable; the client splits larger reads
// and writes itself.
//
// # On disk
//
// A replica is the data file Lookup names (the agent's sparse <name>.img) and a metadata
// file next to it (<name>.img.meta unless Lookup says otherwise), JSON
//
//	{"revision": 12, "dirty": true, "rebuilding": false, "epoch": 3}
//
// (while rebuilding also "rebuildSource": "<addr>/<source id>", where the rebuild was last
// started from), replaced atomically (write a temporary file, fsync, rename, fsync the
// directory). Open persists dirty=true (and epoch+1) before the writer session starts;
// Flush fdatasyncs the data file and then persists the revision it had before the sync;
// CloseSession does the same and clears dirty. The server flushes a written replica too when it closes the file
// (no connection or copier uses it any more, as after its writer died, or the server
// stops), so the revision outlives a process restart as the page cache does. A replica
// whose writer disappeared stays dirty, and a missing metadata file means a new, empty
// replica at revision 0.
//
// # Rebuild
//
// Rebuild makes a replica a byte-for-byte copy of a source replica on another node while
// the writer session keeps writing to both. In order: rebuilding=true is persisted with the
// source (so the replica is never a source again until the copy completes, even across a
// crash, and still names its source after a restart); the data file is punched whole and
// an empty "fresh" set of 512-byte sectors starts, atomically with respect to writes; a
// background copier lists the source's allocated extents (SEEK_DATA/SEEK_HOLE) and pulls
// them in 1 MiB chunks, several in flight. Every write from the writer session marks its
// sectors fresh. The copier applies a chunk under a lock that excludes writes, and only to
// sectors not fresh. The rule that makes the result correct:
// a sector is either fresh, and then holds the writer's newest data (which the source got
// too), or not, and then holds what the source held when the copier read it, the source's
// holes remaining holes because nothing writes them. That needs the source to stay the
// same replica through the copy, written only by the session that writes this one too, so
// when the copy is done the copier asks the source again: if it is rebuilding (punched) or
// its epoch changed (a new writer session, which may have written it without writing this
// replica) the rebuild fails. Otherwise the data file is fdatasynced, the revision raised
// to the source's, and rebuilding=false persisted. A failed copy leaves rebuilding=true and
// reports RebuildError; calling Rebuild again starts over. Writes must be sector aligned
// for this to hold (the target read-modify-writes unaligned ones), and a replica must only
// be sent writes after its Rebuild call returned.
//
// A replica grows while open: Server.Resize (after the node grew its file) makes every
// session see the new size. A rebuild copies the whole current size, also a range that
// appeared during the copy, and fails if the source's size and the replica's differ at the
// start or the end (it is asked again once both have grown).
//
// A replica has at most one copier. Rebuild with the running copier's source, within the
// writer session it was asked for in, leaves it running and returns once it has started.
// Any other Rebuild (another source, as a restarted target may choose, possibly even
// rebuilding the old source; or the same one from a new writer session) cancels the copier,
// waits until it has stopped, and starts over: punch, fresh set, copy. Rebuilding stays
// true throughout. Info reports the source of the current rebuild (RebuildSource, durable)
// and whether a writer session is open (Session), which tells a replica being written from
// one left dirty by a crash.
//
// # Snapshots
//
// Ops 10 (Snapshot) and 11 (DeleteSnapshot) carry a snapshot name ([a-z0-9][a-z0-9.-]{0,127},
// else ErrInvalid). Snapshot needs the caller's writer session (ErrNoSession without one,
// ErrBusy when another connection holds it) and a replica that is not rebuilding
// (ErrInvalid). Under the lock that excludes writes (applyMu; reads go on) it fdatasyncs
// the data file, copies it to "<data>.snap.<name>.data" — a reflink (FICLONE) where the
// file system shares blocks, else a sparse copy of the allocated extents
// (SEEK_DATA/SEEK_HOLE, copy_file_range), holes staying holes — fsyncs the copy, then
// writes "<data>.snap.<name>.snapmeta" atomically as the replica's metadata is written:
//
//	{"size": 4194304, "revision": 12, "epoch": 3, "time": "…", "reflink": true}
//
// (size, revision and epoch of the replica at the copy). The snapshot exists iff its
// metadata does: Snapshot of a complete one reports it (Created false), a partial one
// (a copy without metadata, left by a crash or a failure) is taken again; a full file
// system fails with ErrNoSpace and leaves no copy. DeleteSnapshot removes the metadata,
// then the copy; a missing snapshot is success, and no session is needed.
//
// A snapshot is also a read-only replica, id "<replica id>@<name>" (SnapshotID), for Info
// (its size and revision, never dirty or rebuilding), Extents and Read; Write, Open, Flush,
// CloseSession, Rebuild and Snapshot on it are refused with ErrInvalid. So Rebuild(addr,
// "<replica>@<name>") fills a replica from a snapshot on another node with the copier
// above; the replica may be larger than the snapshot (a restore at a larger size), the
// range past the snapshot's end staying a hole. Readers of a deleted snapshot keep the
// file they opened; the next opener finds the current one, if any.
package replica
