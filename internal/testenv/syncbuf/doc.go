// Package syncbuf is a bytes.Buffer safe for concurrent use: a process's output written by
// exec's copier and a scanner at once, and read by the test meanwhile.
package syncbuf
