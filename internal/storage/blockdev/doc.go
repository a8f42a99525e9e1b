// Package blockdev presents a Device — ReadAt, WriteAt, Flush, Size; in crdipc the
// replicated volume engine of internal/storage/target — to the kernel as a block device, so
// that a file system can be made and mounted on it.
//
// # How
//
// Export mounts a FUSE file system (mount(2) directly, on a /dev/fuse descriptor of its own)
// holding a single file, VolumeName, of the Device's size, and binds a loop device to that
// file with losetup. The kernel's I/O on /dev/loopN becomes reads, writes and fsyncs of the
// file, which the FUSE server in this process (server_linux.go: crdipc's own, on go-fuse's
// protocol types) turns into Device calls.
//
// Why not a kernel NBD client, the usual way to put a user-space block device under a file
// system: these hosts have no nbd module (and no ublk). FUSE and the loop driver are in
// every stock kernel. s3backer exports S3 as a block device the same way (a FUSE file, then
// losetup).
//
// # Caching and direct I/O
//
// The file is opened with FOPEN_DIRECT_IO, so the FUSE layer has no page cache: every read
// comes from the Device, and a write the loop driver has completed is one Device.WriteAt has
// returned from. That holds whichever way the loop driver does its I/O. Export asks for
// loop direct I/O (losetup --direct-io=on) and records what the kernel granted
// (Exported.DirectIO, from sysfs); on these hosts (6.18) it is granted. With it the loop
// driver submits asynchronous I/O, so with CAP_ASYNC_DIO and FOPEN_PARALLEL_DIRECT_WRITES
// several requests (up to Options.MaxWrite, 1 MiB, each) reach the Device at once; the
// buffered fallback is just as safe but handles a device's requests one at a time. The page
// caches above /dev/loopN — the mounted file system's, or the block device's own for
// buffered opens — are emptied by fsync and sync as on any disk.
//
// # What Flush guarantees
//
// The loop device advertises a volatile write cache, so file systems send flush requests
// (journal commits, fsync(2) of their files, sync(2), fsync of /dev/loopN); the loop driver
// turns each into fsync of the FUSE file, and that calls Device.Flush. Closing a writable
// descriptor of the file calls Device.Flush too. When fsync or sync returns success on the
// file system, Device.Flush has returned nil after the last write it covers: what the Device
// promises for Flush (for the target: durable on enough replicas) is what the file system
// gets. A failed Flush, WriteAt or ReadAt reaches the kernel as EIO (logged with the
// original error): a file system sees a failing disk, never a silently lost write.
//
// The Device is called from many goroutines at once and must be safe for concurrent use.
// Writes and truncates cannot change the file's size, and discard is not supported (the
// loop driver turns it off after the first refusal). The size grows only through
// Exported.Resize, after the Device has grown: the FUSE file takes the new size, the
// kernel's cached attributes of it are invalidated, and the loop device re-reads its
// capacity (LOOP_SET_CAPACITY). Growing a file system on the loop device is the caller's
// next step.
//
// # Lifecycle and crashes
//
// Close detaches the loop device and unmounts. If the serving process dies instead, the
// kernel ends the FUSE connection — unless another process holds a descriptor of it
// (Exported.Conn, kept by crdipc's fd holder). Ended, I/O on the loop device fails with EIO
// (it does not hang), and the dead mount and the bound loop device stay until Cleanup
// removes them. Writes the file system had not flushed are lost as on a power cut; flushed
// ones are the Device's.
//
// # Handing over to another process
//
// Kept by another process, the connection, the mount and the loop device outlive the
// server: requests wait in the kernel, and a successor serves them with Adopt. Release is
// the graceful way out (stop reading, answer what was read, leave everything mounted); after
// a crash Adopt asks the kernel to resend what the dead server had read (NOTIFY_RESEND,
// Linux 6.9+), so nothing is lost and no write fails. That works because nothing of what the
// kernel was told lives in a process: the directory is node 1, the file node 2, and a file
// handle only says whether it may write.
package blockdev
