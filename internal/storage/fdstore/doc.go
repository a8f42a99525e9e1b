// Package fdstore keeps open file descriptors for processes that may die, as systemd's
// file-descriptor store does for its services: a process puts a descriptor in under a
// name, and its successor (after a restart, an upgrade or a crash) gets it back.
//
// crdipc's CSI node plugin keeps each volume's FUSE connection here (crdipc fd-holder, a
// DaemonSet of its own). While the store holds a descriptor of a connection, the kernel
// keeps the connection, its mount and the loop device on it through the plugin's death;
// requests wait, and the next plugin serves them (blockdev.Adopt).
//
// The protocol is one datagram per request and one per answer over a SOCK_SEQPACKET Unix
// socket, descriptors as SCM_RIGHTS. A connection first presents the token that the store
// wrote beside its socket (TokenFile), from a process of the store's own user (SO_PEERCRED);
// anything else is answered ERR refused and the connection closed:
//
//	AUTH token                    →  OK
//	PUT name  (+ one descriptor)  →  OK
//	GET name                      →  OK (+ a duplicate of the descriptor) | NOTFOUND
//	DEL name                      →  OK (also when there was none)
//	LIST                          →  OK name\nname…
//
// and ERR reason for a request that is not understood. A PUT replaces (and closes) what the
// name held. The store keeps nothing on disk but its token: descriptors cannot outlive its
// process.
//
// Whoever can use the socket can read every volume's data (a descriptor of its FUSE
// connection) or end it, so the socket lives in a directory of its own, 0700, that only the
// holder and the CSI node plugin mount (DefaultSocket), and the token proves a client could
// read that directory.
package fdstore
