// Package backup keeps volume backups in an S3 bucket, outside the cluster: a restore
// needs the bucket and the key, nothing else.
//
// A backup cuts the volume into fixed-size chunks (ChunkSize, 4 MiB by default). A chunk
// of zeros is not stored. Every other chunk is an object named by a keyed hash of its
// contents (HMAC-SHA256 under a key derived from the store's key), so equal chunks — in
// the backups of one volume, or of different volumes in one store — are stored once, and
// the name says nothing about the contents to whoever lacks the key. Its contents are
// compressed (zstd) and then encrypted (AES-256-GCM under another derived key, the name as
// additional data: an object moved to another name does not decrypt). A manifest per
// backup, encrypted the same way, lists the volume's chunks in order.
//
// A backup is incremental: it lists the chunks the store holds once, at its start, and
// uploads only the chunks missing from it — those that changed since any earlier backup,
// of this volume or another, and any that went missing from the store or were found
// damaged.
//
// A backup that stops half way leaves chunks but no manifest: it does not exist until
// its manifest does, and a backup of the same ID again uploads only what is missing.
//
// Prune deletes the chunks no manifest lists, an epoch after it condemned them, so that it
// never deletes one that a manifest, a running backup or a running restore counts on (see
// Prune). Verify reads every chunk back and records the damaged ones, which the next backup
// that holds their contents uploads again.
//
// The layout of a store, under its prefix, and what an attacker holding the bucket
// learns, are in docs/backup.md.
package backup
