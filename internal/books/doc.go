// Package books is the Book controller of seed 002, built on package ipc: a
// Book is a request to catalogue a book; the controller checks what the
// schema cannot (the ISBN checksum) and replies in the Book's status with
// the Ready condition and an Event.
package books
