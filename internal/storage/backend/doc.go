// Package backend is where a node's pool agent keeps pools and replicas: the operations
// behind CStorPool and CStorVolumeReplica, as an interface with two implementations.
//
// File (the default) keeps a pool as a directory and each replica as a sparse file of the
// replica's capacity in it; capacity comes from statfs. It is real storage on local disk and
// what `crdipc up` and the tests use. ZFS drives zpool/zfs command lines, one zpool per pool
// (on sparse file vdevs) and one sparse zvol per replica; it is tested against recorded
// commands only, never against a real ZFS.
//
// A replica grows (GrowReplica) when its capacity does, in place and never below its size:
// the file is extended sparse, the zvol's volsize raised. The file backend refuses a growth
// its pool has not room left for (ErrNoSpace).
//
// A replica's snapshots (the replica data service's <file>.snap.<name>.* beside the file
// backend's replica file) are deleted with the replica.
//
// Every operation is idempotent, because an agent may be killed between doing something and
// recording it: Create* adopts what already exists, Delete* treats "not found" as success.
// Import and Stat never create: a pool or replica that existed once and is gone is reported
// (ErrNotFound), not silently re-created empty.
package backend
