// Package safefile reads and writes the files crdipc keeps in its data directories: keys,
// certificates, tokens, ports, replica and pool metadata.
//
// Two promises, for every file:
//   - Never through a symlink. A name inside the data dir that someone turned into a symlink
//     (to /etc/shadow, to another user's file) is refused with ELOOP instead of followed, so a
//     write cannot clobber, and a read cannot adopt, a file outside the directory.
//   - Written atomically and durably. A write goes to a new temporary file in the same
//     directory, is fsynced, renamed over the name, and the directory is fsynced, so a crash
//     or power loss leaves the old content or the new, never a torn or empty file that the
//     next start would fail to parse — and the rename itself is not lost.
//
// github.com/google/renameio does the first half of the write (temporary file, fsync,
// rename) but does not fsync the directory and follows symlinks on read; the whole is short
// enough to keep here.
package safefile
