// Package target is the volume engine: one per staged volume, it turns the volume's
// replicas (each served by a node's replica server, see package replica) into one block
// device (ReadAt/WriteAt/Flush/Size, the blockdev.Device interface).
//
// # Consistency rule
//
// Every acknowledged write is on at least ConsistencyFactor (CF) healthy replicas. A write
// goes to every replica of the write set (healthy and rebuilding ones) under a fresh
// revision and returns only when every one of them answered or was faulted, and only with
// success if at least CF healthy ones applied it; otherwise it fails with ErrNoQuorum and is
// not acknowledged (it may be on some replicas, as a torn write may be on a disk).
// Overlapping writes are serialized by a range lock, so all replicas apply them in the same
// order; writes that are not whole 512-byte sectors are widened by read-modify-write under
// that lock. Flush needs CF healthy successes too.
//
// A replica's revision is the highest it applied. The engine keeps its next revision above
// every revision any replica reported, and when a healthy replica fails a write the same data
// is written again, under a new revision, to those that remain: so a replica that left the
// write set always has a lower revision than the ones that went on. With CF a majority of
// the replicas, any CF replicas therefore include one holding every acknowledged write, and
// the one with the highest revision is such a one. This is why start needs CF reachable
// complete replicas.
//
// # Start
//
// New asks every replica for its Info. It needs CF reachable replicas that are not
// rebuilding (else ErrNoQuorum), and takes the freshest as source (replica.ChooseSource:
// highest revision, a clean one on a tie). Replicas closed cleanly at the source's revision
// while the source was closed cleanly too are healthy; every other one (stale, dirty, or
// rebuilding) is rebuilt from the source. After an unclean shutdown the source is dirty, so
// it is the only healthy replica until the rebuilds finish: writes then fail with
// ErrNoQuorum (or wait, see Options.QuorumWait and WaitQuorum) while reads work.
//
// If that target dies too before the rebuilds finish, and their copiers stop (say the
// nodes restart), fewer than CF replicas are complete. A replica records durably which one
// it rebuilds from (Info.RebuildSource), and each rebuild began from a replica holding every
// acknowledged write; so when every member answers and all but one are rebuilding from
// that one, directly or through a chain of rebuilding replicas (r2 from r0, r0 from r1), it
// holds every acknowledged write (nothing could be acknowledged without a second complete
// replica since the last of those rebuilds began, and that one's source was the one) and
// is taken as the source. Any other shortfall still fails with ErrNoQuorum.
//
// # Failures
//
//   - A replica that fails or times out (IOTimeout) on a write, read or flush is faulted:
//     it leaves the write set at once and OnReplicaState reports it. Reads go to the next
//     healthy replica; writes and flushes go on while CF healthy replicas remain.
//   - Fewer than CF healthy replicas: writes and flushes fail with ErrNoQuorum, without
//     being sent; reads go on from any healthy one.
//   - Every RejoinInterval a faulted replica is retried: reconnect (Member.Dial), Info,
//     Open, then it joins as rebuilding from a healthy replica. It is always rebuilt, even
//     when its revision looks current, since a write that failed on it does not show in
//     its revision. A rebuild starts with no write in flight, so the replica's record of
//     sectors written since (which the copier must not overwrite) misses none.
//   - A rebuilding replica is polled, every 200ms at most: when it is no longer rebuilding
//     and its revision reaches what was acknowledged when the rebuild began, it is
//     healthy. If its copier failed (for instance its source died) the rebuild is
//     restarted from a healthy one.
//   - No healthy replica left: as soon as CF complete replicas are reachable again (or
//     every other replica is rebuilding from one, as at start) the freshest becomes the
//     healthy one (the same rule as at start) and the others rebuild from it.
//   - The target dies: the replicas stay dirty, and the next New rebuilds them from the
//     freshest.
//
// # Growth
//
// Grow raises the volume size once every healthy replica holds the new size (their agents
// grow them first); I/O past the old end is refused until then. A rebuilding or rejoining
// replica smaller than the volume is kept out of the write set until it has grown, and a
// rebuild copies the replica's whole current size.
//
// # Snapshots
//
// Snapshot takes a crash-consistent snapshot: holding the barrier that every write fan-out
// holds shared, no write is half applied and every healthy replica holds the same data, so
// the copies (replica.Client.Snapshot) are alike, and each holds every write acknowledged
// before the call. Writes wait meanwhile, reads do not. It stands when ConsistencyFactor
// healthy replicas took it; otherwise the copies made are deleted again. A replica that
// refuses (no space, say) is only named; one whose connection fails is faulted, as on a
// write. A name stands for one content: asked again, existing copies are returned and any
// made now are deleted. DeleteSnapshot deletes it on every member, dialling faulted ones.
//
// Close waits for writes in flight, then ends every writer session (clearing Dirty);
// replicas that were faulted stay dirty and are rebuilt at the next start.
package target
