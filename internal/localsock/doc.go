// Package localsock opens Unix sockets that only a node's own privileged components may
// use, and admits their clients.
//
// A socket lives in a directory of its own, made 0700, beside a token file (TokenFile,
// 0600, written anew by each Listen). A client is admitted only if it runs as the
// listener's own user (SO_PEERCRED) and presents the token, which proves it could read the
// socket's directory: on a Kubernetes node, that it is a container that mounts it. Both
// the fd holder's store (package fdstore) and the pool agent's local replica link (package
// replica, Server.ServeLocal) are reached this way.
//
// A datagram socket (unixpacket) frames the token as its user likes (Check does the
// checking). A stream socket uses Admit and Dial, one line each way:
//
//	AUTH <token>\n   →   OK <hello>\n | ERR refused: <why>\n
//
// where hello is what the listener says of itself (the pool agent: its node's name), so a
// client can tell it reached the listener it meant.
package localsock
